{{/* Names, labels and the pieces every specrl pod shares. */}}

{{- define "specrl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "specrl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "specrl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels of one component: (dict "root" $ "component" "rollout") */}}
{{- define "specrl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specrl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "specrl.labels" -}}
helm.sh/chart: {{ include "specrl.chart" .root }}
{{ include "specrl.selectorLabels" . }}
app.kubernetes.io/part-of: specrl
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "specrl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specrl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image of a component: its own `image` values over the release's: (dict "root" $ "image" ...) */}}
{{- define "specrl.image" -}}
{{- $i := mergeOverwrite (deepCopy .root.Values.image) (default dict .image) }}
{{- printf "%s:%s" $i.repository (default .root.Chart.AppVersion $i.tag) }}
{{- end }}

{{/* In-cluster DNS names. */}}
{{- define "specrl.svc" -}}
{{- printf "%s-%s.%s.svc" (include "specrl.fullname" .root) .component .root.Release.Namespace }}
{{- end }}

{{/* Pod `index` of a component's StatefulSet, through its headless Service. */}}
{{- define "specrl.podHost" -}}
{{- $full := include "specrl.fullname" .root }}
{{- printf "%s-%s-%d.%s-%s-headless.%s.svc" $full .component (int .index) $full .component .root.Release.Namespace }}
{{- end }}

{{/* Every rollout pod, through the headless Service's DNS name (rollout.discover). */}}
{{- define "specrl.rolloutDiscover" -}}
{{- $full := include "specrl.fullname" . }}
{{- printf "dns:%s-rollout-headless.%s.svc:%d" $full .Release.Namespace (int .Values.rollout.port) }}
{{- end }}

{{/* The Secret with the services' TLS certificate, "" when mutual TLS is off. */}}
{{- define "specrl.tlsSecret" -}}
{{- if .Values.tls.enabled }}
{{- if .Values.tls.existingSecret }}
{{- .Values.tls.existingSecret }}
{{- else if .Values.tls.certManager.enabled }}
{{- printf "%s-tls" (include "specrl.fullname" .) }}
{{- else }}
{{- fail "tls.enabled needs tls.existingSecret or tls.certManager.enabled" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "specrl.runDir" -}}
{{- printf "%s/%s" .Values.runs.mountPath .Values.orchestrator.config.name }}
{{- end }}

{{- define "specrl.runsClaim" -}}
{{- default (printf "%s-runs" (include "specrl.fullname" .)) .Values.runs.existingClaim }}
{{- end }}

{{- define "specrl.redisSecret" -}}
{{- default (printf "%s-redis" (include "specrl.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* "true" when Redis wants a password: ours always, an external one with a Secret. */}}
{{- define "specrl.redisAuth" -}}
{{- if or .Values.redis.enabled .Values.redis.auth.existingSecret }}true{{ end }}
{{- end }}

{{- define "specrl.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s:6379/0" (include "specrl.svc" (dict "root" . "component" "redis")) }}
{{- else }}
{{- required "redis.url is required when redis.enabled is false" .Values.redis.url }}
{{- end }}
{{- end }}

{{/* The trainer's rank count, checked against its tp x dp. */}}
{{- define "specrl.trainerWorld" -}}
{{- $world := mul (int .Values.trainer.nodes) (int .Values.trainer.procsPerNode) }}
{{- $t := .Values.trainer.config.trainer }}
{{- $tpdp := mul (int (default 1 $t.tp)) (int (default 1 $t.dp)) }}
{{- if ne (int $world) (int $tpdp) }}
{{- fail (printf "trainer.nodes x trainer.procsPerNode (%d ranks) must equal trainer.config.trainer.tp x dp (%d)" (int $world) (int $tpdp)) }}
{{- end }}
{{- $world }}
{{- end }}

{{/* Pod-level fields every specrl pod shares: (dict "root" $ "affinity" ...) */}}
{{- define "specrl.podCommon" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ include "specrl.serviceAccountName" .root }}
automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Pod metadata: labels, config checksum (a config change rolls the pods), annotations. */}}
{{- define "specrl.podMeta" -}}
labels:
  {{- include "specrl.labels" . | nindent 2 }}
  {{- with .extraLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
  {{- with .root.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Volumes of a specrl pod: config, scratch, models, and the run directory if `runs`. */}}
{{- define "specrl.volumes" -}}
{{- $v := .root.Values -}}
- name: config
  configMap:
    name: {{ include "specrl.fullname" .root }}-config
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ $v.shm.sizeLimit }}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {}
{{- if $v.models.existingClaim }}
- name: models
  persistentVolumeClaim:
    claimName: {{ $v.models.existingClaim }}
    readOnly: true
{{- end }}
{{- if .runs }}
- name: runs
  persistentVolumeClaim:
    claimName: {{ include "specrl.runsClaim" .root }}
{{- end }}
{{- with include "specrl.tlsSecret" .root }}
- name: tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{- define "specrl.volumeMounts" -}}
{{- $v := .root.Values -}}
- name: config
  mountPath: /etc/specrl
  readOnly: true
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /home/specrl/.cache
{{- if $v.models.existingClaim }}
- name: models
  mountPath: {{ $v.models.mountPath }}
  readOnly: true
{{- end }}
{{- if .runs }}
- name: runs
  mountPath: {{ $v.runs.mountPath }}
{{- end }}
{{- if include "specrl.tlsSecret" .root }}
- name: tls
  mountPath: /etc/specrl/tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Container fields every specrl container shares (image, security, env). */}}
{{- define "specrl.containerCommon" -}}
{{- $v := .root.Values -}}
image: {{ include "specrl.image" . }}
imagePullPolicy: {{ $v.image.pullPolicy }}
securityContext:
  {{- toYaml $v.containerSecurityContext | nindent 2 }}
env:
  - name: HOME
    value: /home/specrl
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- if include "specrl.tlsSecret" .root }}
  - name: SPECRL_TLS_CERT
    value: /etc/specrl/tls/tls.crt
  - name: SPECRL_TLS_KEY
    value: /etc/specrl/tls/tls.key
  - name: SPECRL_TLS_CA
    value: /etc/specrl/tls/ca.crt
  - name: SPECRL_TLS_SERVER_NAME
    value: {{ $v.tls.serverName | quote }}
  {{- end }}
  {{- with .env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with $v.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Resources with `gpus` GPUs (and the RDMA devices) added when gpus > 0. */}}
{{- define "specrl.resources" -}}
{{- $r := deepCopy (default dict .resources) }}
{{- if gt (int .gpus) 0 }}
{{- $limits := default dict $r.limits }}
{{- $requests := default dict $r.requests }}
{{- $_ := set $limits .root.Values.gpu.resourceName (int .gpus) }}
{{- $_ := set $requests .root.Values.gpu.resourceName (int .gpus) }}
{{- range $name, $n := .root.Values.nvlink.rdmaResources }}
{{- $_ := set $limits $name $n }}
{{- $_ := set $requests $name $n }}
{{- end }}
{{- $_ := set $r "limits" $limits }}
{{- $_ := set $r "requests" $requests }}
{{- end }}
{{- toYaml $r }}
{{- end }}

{{/* gRPC probes on `port`: startup and readiness ask gRPC health; liveness only checks
that the port answers, since a replica may report NOT_SERVING for a while (waiting for
its first weights) without being broken. */}}
{{- define "specrl.probes" -}}
{{- /* the kubelet's gRPC probe speaks plaintext: under mutual TLS, `specrl health` asks */}}
{{- $ask := dict "grpc" (dict "port" .port) }}
{{- if .root.Values.tls.enabled }}
{{- $ask = dict "exec" (dict "command" (list "specrl" "health" "--timeout" "5" (printf "127.0.0.1:%d" (int .port)))) }}
{{- end -}}
startupProbe:
  {{- toYaml $ask | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 10
  failureThreshold: {{ div (int .startupSeconds) 10 }}
readinessProbe:
  {{- toYaml $ask | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 10
  failureThreshold: 3
livenessProbe:
  tcpSocket:
    port: {{ .port }}
  periodSeconds: 20
  failureThreshold: 6
{{- end }}
