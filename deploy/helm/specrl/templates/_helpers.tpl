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

{{/* Labels of a pod template: no chart version nor app version (a chart bump must not roll
every pod; the image tag says what runs). */}}
{{- define "specrl.podLabels" -}}
{{ include "specrl.selectorLabels" . }}
app.kubernetes.io/part-of: specrl
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

{{/* Every rollout pod, through the headless Service's DNS name (`helm test`'s `specrl
health`, and the orchestrator's rollout.discover with orchestrator.discovery dns). */}}
{{- define "specrl.rolloutDns" -}}
{{- $full := include "specrl.fullname" . }}
{{- printf "dns:%s-rollout-headless.%s.svc:%d" $full .Release.Namespace (int .Values.rollout.port) }}
{{- end }}

{{/* How the orchestrator finds every rollout pod as they come and go (run.yaml's
rollout.discover): the EndpointSlices of the headless Service, watched through the
Kubernetes API (orchestrator.discovery endpointslices), or its DNS name (dns). */}}
{{- define "specrl.rolloutDiscover" -}}
{{- $how := .Values.orchestrator.discovery }}
{{- if eq $how "dns" }}
{{- include "specrl.rolloutDns" . }}
{{- else if eq $how "endpointslices" }}
{{- printf "k8s:%s/%s-rollout-headless:%d" .Release.Namespace (include "specrl.fullname" .) (int .Values.rollout.port) }}
{{- else }}
{{- fail (printf "orchestrator.discovery must be endpointslices or dns, not %q" $how) }}
{{- end }}
{{- end }}

{{/* "true" when the orchestrator's own container calls the Kubernetes API (EndpointSlice
discovery, rollout.orchestratorScaling): it then mounts the ServiceAccount token. (The
release step, orchestrator.releaseOnCompletion, is another container of the pod.) */}}
{{- define "specrl.orchestratorUsesApi" -}}
{{- if or (eq .Values.orchestrator.discovery "endpointslices") .Values.rollout.orchestratorScaling.enabled }}true{{ end }}
{{- end }}

{{/* The rollout workload's API, as JSON: a StatefulSet, or a LeaderWorkerSet when a
replica spans pods (specrl.rolloutNodes > 1). `resource` is the plural its scale
subresource is under (<resource>/scale). */}}
{{- define "specrl.rolloutWorkload" -}}
{{- if gt (int (include "specrl.rolloutNodes" .)) 1 }}
{{- toJson (dict "group" "leaderworkerset.x-k8s.io" "version" "v1" "resource" "leaderworkersets" "kind" "LeaderWorkerSet") }}
{{- else }}
{{- toJson (dict "group" "apps" "version" "v1" "resource" "statefulsets" "kind" "StatefulSet") }}
{{- end }}
{{- end }}

{{/* The rollout workload's `replicas`; empty (the field left out) when an HPA or KEDA owns
the count. With rollout.orchestratorScaling the orchestrator owns it while the run goes
on, so a `helm upgrade` must not reset it: the count is the live object's (helm's
`lookup`; it finds nothing at install and under `helm template`, and then
rollout.replicas is used), clamped into [minReplicas, maxReplicas] (a finished run's
release step leaves it at 0, which a new run could not start from). */}}
{{- define "specrl.rolloutReplicas" -}}
{{- $r := .Values.rollout }}
{{- if $r.orchestratorScaling.enabled }}
{{- $s := $r.orchestratorScaling }}
{{- $w := fromJson (include "specrl.rolloutWorkload" .) }}
{{- $live := lookup (printf "%s/%s" $w.group $w.version) $w.kind .Release.Namespace (printf "%s-rollout" (include "specrl.fullname" .)) }}
{{- $n := int $r.replicas }}
{{- if $live }}{{ $n = int (dig "spec" "replicas" $n $live) }}{{ end }}
{{- max (int $s.minReplicas) (min (int $s.maxReplicas) $n) }}
{{- else if not (or $r.autoscaling.enabled $r.keda.enabled) }}
{{- $r.replicas }}
{{- end }}
{{- end }}

{{/* The sequences one rollout replica batches: the per-replica target of the demand
scalers (KEDA's demand trigger, the HPA's External metric). */}}
{{- define "specrl.rolloutCapacity" -}}
{{- $r := .Values.rollout }}
{{- $capacity := int $r.keda.sequencesPerReplica }}
{{- if not $capacity }}
{{- $capacity = int (required "rollout.keda / rollout.autoscaling scale on demand per replica: set rollout.keda.sequencesPerReplica or rollout.config.engine.max_num_seqs" (dig "engine" "max_num_seqs" nil $r.config)) }}
{{- end }}
{{- $capacity }}
{{- end }}

{{/* The Secret with a component's TLS certificate, "" when mutual TLS is off:
(dict "root" $ "component" "rollout"). An existing Secret serves every component; the
chart's cert-manager Certificates (certificate.yaml) make one Secret per component. */}}
{{- define "specrl.tlsSecret" -}}
{{- $v := .root.Values }}
{{- if $v.tls.enabled }}
{{- if $v.tls.existingSecret }}
{{- $v.tls.existingSecret }}
{{- else if $v.tls.certManager.enabled }}
{{- printf "%s-%s-tls" (include "specrl.fullname" .root) (required "specrl.tlsSecret needs the component" .component) }}
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

{{/* The PriorityClass of a role (trainer, control, rollout; none: the release's
`priorityClassName`): (dict "root" $ "role" ...) */}}
{{- define "specrl.priorityClassName" -}}
{{- $v := .root.Values }}
{{- $pc := dict }}
{{- if .role }}{{ $pc = index $v.priorityClasses .role }}{{ end }}
{{- if $pc.name }}
{{- $pc.name }}
{{- else if and .role $v.priorityClasses.create }}
{{- printf "%s-%s" (include "specrl.fullname" .root) .role }}
{{- else }}
{{- $v.priorityClassName }}
{{- end }}
{{- end }}

{{/* A component's affinity: its `affinity` values plus what the chart adds. Every pod of
the NCCL groups (trainer, rollout, draft-trainer) in one NVLink clique when they share a
ComputeDomain (MNNVL reaches only inside one NVLink fabric); the trainer's pods in one
clique (nvlink.trainerInOneClique); rollout pods preferring nodes that already hold rollout
pods (rollout.packNodes): (dict "root" $ "component" ... "affinity" ...) */}}
{{- define "specrl.affinity" -}}
{{- $v := .root.Values }}
{{- $a := deepCopy (default dict .affinity) }}
{{- $pa := default dict $a.podAffinity }}
{{- $required := default list $pa.requiredDuringSchedulingIgnoredDuringExecution }}
{{- $preferred := default list $pa.preferredDuringSchedulingIgnoredDuringExecution }}
{{- $own := fromYaml (include "specrl.selectorLabels" .) }}
{{- if and (eq .component "trainer") $v.nvlink.trainerInOneClique }}
{{- $required = append $required (dict "labelSelector" (dict "matchLabels" $own) "topologyKey" $v.nvlink.cliqueLabel) }}
{{- end }}
{{- if and $v.nvlink.computeDomain.enabled (has .component (list "trainer" "rollout" "draft-trainer")) }}
{{- $release := dict "app.kubernetes.io/name" (include "specrl.name" .root) "app.kubernetes.io/instance" .root.Release.Name }}
{{- $nccl := dict "key" "app.kubernetes.io/component" "operator" "In" "values" (list "draft-trainer" "rollout" "trainer") }}
{{- $required = append $required (dict "labelSelector" (dict "matchLabels" $release "matchExpressions" (list $nccl)) "topologyKey" $v.nvlink.cliqueLabel) }}
{{- end }}
{{- if and (eq .component "rollout") $v.rollout.packNodes }}
{{- $term := dict "labelSelector" (dict "matchLabels" $own) "topologyKey" "kubernetes.io/hostname" }}
{{- $preferred = append $preferred (dict "weight" 100 "podAffinityTerm" $term) }}
{{- end }}
{{- if $required }}{{ $_ := set $pa "requiredDuringSchedulingIgnoredDuringExecution" $required }}{{ end }}
{{- if $preferred }}{{ $_ := set $pa "preferredDuringSchedulingIgnoredDuringExecution" $preferred }}{{ end }}
{{- if $pa }}{{ $_ := set $a "podAffinity" $pa }}{{ end }}
{{- if $a }}{{ toYaml $a }}{{ end }}
{{- end }}

{{/* The ComputeDomain of the release (one: a rack never gets two overlapping domains) and
its IMEX channel's ResourceClaimTemplate, which the DRA driver's controller makes. */}}
{{- define "specrl.computeDomain" -}}
{{- printf "%s-nvlink" (include "specrl.fullname" .) }}
{{- end }}
{{- define "specrl.computeDomainChannel" -}}
{{- printf "%s-nvlink-channel" (include "specrl.fullname" .) }}
{{- end }}

{{/* Pod-level resourceClaims of an NCCL group's pod: the ComputeDomain's IMEX channel. */}}
{{- define "specrl.nvlinkClaims" -}}
{{- if .Values.nvlink.computeDomain.enabled -}}
resourceClaims:
  - name: imex
    resourceClaimTemplateName: {{ include "specrl.computeDomainChannel" . }}
{{- end }}
{{- end }}

{{/* A container's share of the claims above (under its `resources`). */}}
{{- define "specrl.nvlinkContainerClaims" -}}
{{- if .Values.nvlink.computeDomain.enabled -}}
claims:
  - name: imex
{{- end }}
{{- end }}

{{/* Pod-level fields every specrl pod shares: (dict "root" $ "affinity" ... "role" ...) */}}
{{- define "specrl.podCommon" -}}
{{- $v := .root.Values -}}
serviceAccountName: {{ default (include "specrl.serviceAccountName" .root) .serviceAccount }}
automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "specrl.priorityClassName" . }}
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

{{/* Pod metadata: labels, the checksum of what this pod reads (its own service's config
file, and what else it mounts: a change to another service's config rolls nothing here),
annotations: (dict "root" $ "component" ... "checksum" ... "extraLabels" ...) */}}
{{- define "specrl.podMeta" -}}
labels:
  {{- include "specrl.podLabels" . | nindent 2 }}
  {{- with .extraLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ required "specrl.podMeta needs a checksum" .checksum }}
  {{- with .root.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Volumes of a specrl pod: config, scratch, models, the run directory if `runs`, and
the component's TLS certificate: (dict "root" $ "runs" bool "component" "rollout"). */}}
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
{{- with include "specrl.tlsSecret" . }}
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
  mountPath: {{ include "specrl.cacheDir" . }}
{{- if $v.models.existingClaim }}
- name: models
  mountPath: {{ $v.models.mountPath }}
  readOnly: true
{{- end }}
{{- if .runs }}
- name: runs
  mountPath: {{ $v.runs.mountPath }}
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  mountPath: /etc/specrl/tls
  readOnly: true
{{- end }}
{{- end }}

{{/* Where the `cache` emptyDir is mounted: writable under the read-only root. */}}
{{- define "specrl.cacheDir" -}}
/home/specrl/.cache
{{- end }}

{{/* Container fields every specrl container shares (image, security, env):
(dict "root" $ "image" ... "env" ... "gpus" n). A container with GPUs gets the RDMA
devices (specrl.resources) and with them IPC_LOCK: RDMA registers (pins) memory. */}}
{{- define "specrl.containerCommon" -}}
{{- $v := .root.Values -}}
{{- $security := deepCopy $v.containerSecurityContext }}
{{- if and $v.nvlink.rdmaResources (gt (int .gpus) 0) }}
{{- $caps := default dict $security.capabilities }}
{{- $_ := set $caps "add" (uniq (append (default list $caps.add) "IPC_LOCK")) }}
{{- $_ := set $security "capabilities" $caps }}
{{- end -}}
image: {{ include "specrl.image" . }}
imagePullPolicy: {{ $v.image.pullPolicy }}
securityContext:
  {{- toYaml $security | nindent 2 }}
env:
  - name: HOME
    value: /home/specrl
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  {{- /* the root filesystem is read-only: every cache and config directory the engines
  (vLLM, torch.compile / Inductor, Triton, CUDA's JIT, torch extensions, Hugging Face)
  write, which would default under $HOME, goes to the `cache` emptyDir */}}
  {{- range $name, $sub := dict "XDG_CACHE_HOME" "" "XDG_CONFIG_HOME" "config" "TRITON_HOME" "" "TRITON_CACHE_DIR" "triton" "TORCHINDUCTOR_CACHE_DIR" "torchinductor" "TORCH_EXTENSIONS_DIR" "torch_extensions" "TORCH_HOME" "torch" "CUDA_CACHE_PATH" "nv/ComputeCache" "VLLM_CACHE_ROOT" "vllm" "VLLM_CONFIG_ROOT" "config/vllm" "HF_HOME" "huggingface" }}
  - name: {{ $name }}
    value: {{ trimSuffix "/" (printf "%s/%s" (include "specrl.cacheDir" $) $sub) }}
  {{- end }}
  {{- if $v.tls.enabled }}
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
