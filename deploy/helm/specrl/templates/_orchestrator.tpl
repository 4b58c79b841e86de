{{/* The orchestrator Job's spec (orchestrator.yaml): (dict "root" $ "ctx" ... "checksum"
... "account" ... "targets" ... "tokenSecret" ...). The ServiceAccount token (a projected
volume; the pod mounts none by itself) goes to the containers that call the Kubernetes
API only: the orchestrator's with EndpointSlice discovery or orchestratorScaling
(specrl.orchestratorUsesApi), the release step's with releaseOnCompletion. */}}
{{- define "specrl.orchestratorJobSpec" -}}
{{- $root := .root }}
{{- $o := $root.Values.orchestrator -}}
{{- $api := include "specrl.orchestratorUsesApi" $root -}}
# A failed attempt is retried with --continue: it resumes the run from its last
# checkpoint (exit 75: a service failed, the state is kept). Exit 1 or 2 (bad config
# or input, a run that cannot be resumed) fails the Job at once; a node drain or
# preemption does not count against the limit.
backoffLimit: {{ $o.backoffLimit }}
podFailurePolicy:
  rules:
    - action: FailJob
      onExitCodes:
        containerName: orchestrator
        operator: In
        values: [1, 2]
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
          status: "True"
template:
  metadata:
    {{- include "specrl.podMeta" (merge (dict "checksum" .checksum) .ctx) | nindent 4 }}
  spec:
    restartPolicy: Never
    {{- include "specrl.podCommon" (dict "root" $root "affinity" $o.affinity "role" "control" "serviceAccount" .account) | nindent 4 }}
    containers:
      - name: orchestrator
        {{- $env := list (dict "name" "SPECRL_CONTROL_TOKEN" "valueFrom" (dict "secretKeyRef" (dict "name" .tokenSecret "key" "token"))) }}
        {{- if include "specrl.redisAuth" $root }}
        {{- $env = append $env (dict "name" "SPECRL_REDIS_PASSWORD" "valueFrom" (dict "secretKeyRef" (dict "name" (include "specrl.redisSecret" $root) "key" $root.Values.redis.auth.existingSecretKey))) }}
        {{- end }}
        {{- include "specrl.containerCommon" (dict "root" $root "image" $o.image "env" $env) | nindent 8 }}
        args: [run, --config, /etc/specrl/run.yaml, --continue]
        ports:
          - name: metrics
            containerPort: {{ $o.metricsPort }}
          - name: status
            containerPort: {{ $o.statusPort }}
        resources:
          {{- toYaml $o.resources | nindent 10 }}
        volumeMounts:
          {{- include "specrl.volumeMounts" (dict "root" $root "runs" true) | nindent 10 }}
          {{- if $api }}
          - name: kube-api-access  # EndpointSlice discovery, orchestratorScaling
            mountPath: /var/run/secrets/kubernetes.io/serviceaccount
            readOnly: true
          {{- end }}
      {{- if $o.releaseOnCompletion }}
      - name: release
        {{- $env := list (dict "name" "SPECRL_RELEASE_TARGETS" "value" (toJson .targets)) }}
        {{- include "specrl.containerCommon" (dict "root" $root "image" $o.image "env" $env) | nindent 8 }}
        command: [python3, /etc/specrl/release/release.py]
        resources:
          requests: {cpu: 10m, memory: 64Mi}
          limits: {memory: 128Mi}
        volumeMounts:
          - name: release
            mountPath: /etc/specrl/release
            readOnly: true
          - name: kube-api-access
            mountPath: /var/run/secrets/kubernetes.io/serviceaccount
            readOnly: true
          - name: tmp
            mountPath: /tmp
          - name: cache
            mountPath: {{ include "specrl.cacheDir" $root }}
      {{- end }}
    volumes:
      {{- include "specrl.volumes" (dict "root" $root "runs" true "component" "orchestrator") | nindent 6 }}
      {{- if $o.releaseOnCompletion }}
      - name: release
        configMap:
          name: {{ include "specrl.fullname" $root }}-release
      {{- end }}
      {{- if or $o.releaseOnCompletion $api }}
      - name: kube-api-access  # only the containers that call the API mount it: the pod mounts no token
        projected:
          sources:
            - serviceAccountToken:
                path: token
                expirationSeconds: 3607
            - configMap:
                name: kube-root-ca.crt
                items:
                  - key: ca.crt
                    path: ca.crt
            - downwardAPI:
                items:
                  - path: namespace
                    fieldRef:
                      fieldPath: metadata.namespace
      {{- end }}
{{- end }}

{{/* The rules of the orchestrator pod's Role (<release>-orchestrator), as JSON: exactly
what its containers call, each verb on named objects where the API allows. The release
step (orchestrator.releaseOnCompletion): `get` on pods (its own pod's container status; a
pod's name is not known before it exists) and `patch` on each workload it releases, by
name. EndpointSlice discovery (orchestrator.discovery endpointslices): `list` and `watch`
on endpointslices (a label selector, kubernetes.io/service-name, picks the rollout's:
RBAC cannot restrict list and watch by label). rollout.orchestratorScaling: `get` and
`patch` on the rollout workload's scale subresource, by name. Nothing to create or
delete, no wildcard. "[]" when the pod calls no API. */}}
{{- define "specrl.orchestratorRules" -}}
{{- $v := .Values }}
{{- $full := include "specrl.fullname" . }}
{{- $rules := list }}
{{- if $v.orchestrator.releaseOnCompletion }}
{{- $rules = append $rules (dict "apiGroups" (list "") "resources" (list "pods") "verbs" (list "get")) }}
{{- $byResource := dict }}
{{- range fromJsonArray (include "specrl.releaseTargets" .) }}
{{- $key := printf "%s|%s" .group .resource }}
{{- $_ := set $byResource $key (append (default list (get $byResource $key)) .name) }}
{{- end }}
{{- range $key, $names := $byResource }}
{{- $rules = append $rules (dict "apiGroups" (list (splitList "|" $key | first)) "resources" (list (splitList "|" $key | last)) "resourceNames" $names "verbs" (list "patch")) }}
{{- end }}
{{- end }}
{{- if eq $v.orchestrator.discovery "endpointslices" }}
{{- $rules = append $rules (dict "apiGroups" (list "discovery.k8s.io") "resources" (list "endpointslices") "verbs" (list "list" "watch")) }}
{{- end }}
{{- if $v.rollout.orchestratorScaling.enabled }}
{{- $w := fromJson (include "specrl.rolloutWorkload" .) }}
{{- $rules = append $rules (dict "apiGroups" (list $w.group) "resources" (list (printf "%s/scale" $w.resource)) "resourceNames" (list (printf "%s-rollout" $full)) "verbs" (list "get" "patch")) }}
{{- end }}
{{- toJson $rules }}
{{- end }}

{{/* What a finished run releases (orchestrator.releaseOnCompletion), as JSON for
files/release.py: the rollout StatefulSet or LeaderWorkerSet and the draft-trainer scaled
to zero, the trainer's StatefulSet scaled to zero or its JobSet suspended, and a KEDA
ScaledObject paused at zero first (else KEDA scales the rollout back up; an HPA stops
acting on a target at zero replicas by itself). */}}
{{- define "specrl.releaseTargets" -}}
{{- $full := include "specrl.fullname" . }}
{{- $v := .Values }}
{{- $zero := dict "spec" (dict "replicas" 0) }}
{{- $targets := list }}
{{- if $v.rollout.keda.enabled }}
{{- $paused := dict "metadata" (dict "annotations" (dict "autoscaling.keda.sh/paused-replicas" "0")) }}
{{- $targets = append $targets (dict "group" "keda.sh" "version" "v1alpha1" "resource" "scaledobjects" "name" (printf "%s-rollout" $full) "patch" $paused) }}
{{- end }}
{{- if gt (int (include "specrl.rolloutNodes" .)) 1 }}
{{- $targets = append $targets (dict "group" "leaderworkerset.x-k8s.io" "version" "v1" "resource" "leaderworkersets/scale" "name" (printf "%s-rollout" $full) "patch" $zero) }}
{{- else }}
{{- $targets = append $targets (dict "group" "apps" "version" "v1" "resource" "statefulsets/scale" "name" (printf "%s-rollout" $full) "patch" $zero) }}
{{- end }}
{{- if eq $v.trainer.workload "jobset" }}
{{- $targets = append $targets (dict "group" "jobset.x-k8s.io" "version" "v1alpha2" "resource" "jobsets" "name" (printf "%s-trainer" $full) "patch" (dict "spec" (dict "suspend" true))) }}
{{- else }}
{{- $targets = append $targets (dict "group" "apps" "version" "v1" "resource" "statefulsets/scale" "name" (printf "%s-trainer" $full) "patch" $zero) }}
{{- end }}
{{- if $v.draftTrainer.enabled }}
{{- $targets = append $targets (dict "group" "apps" "version" "v1" "resource" "statefulsets/scale" "name" (printf "%s-draft-trainer" $full) "patch" $zero) }}
{{- end }}
{{- toJson $targets }}
{{- end }}
