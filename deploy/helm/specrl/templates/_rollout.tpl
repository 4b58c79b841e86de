{{/* A rollout replica's pods per replica (rollout.podsPerReplica): 1 is a StatefulSet
pod; more make each replica a LeaderWorkerSet group whose vLLM engine spans the pods. */}}
{{- define "specrl.rolloutNodes" -}}
{{- int (default 1 .Values.rollout.podsPerReplica) }}
{{- end }}

{{/* The rollout pod template: (dict "root" $ "role" "" | "leader" | "worker"). The
leader (or the only pod) serves gRPC; a worker holds its share of the engine's
tensor-parallel ranks (`specrl serve rollout-worker`, node rank from LeaderWorkerSet's
LWS_WORKER_INDEX) and serves nothing itself. */}}
{{- define "specrl.rolloutPod" -}}
{{- $root := .root }}
{{- $r := $root.Values.rollout }}
{{- $nodes := int (include "specrl.rolloutNodes" $root) }}
{{- $extra := dict }}
{{- if .role }}
{{- $_ := set $extra "specrl.dev/rollout-role" .role }}
{{- end }}
{{- $affinity := fromYaml (include "specrl.affinity" (dict "root" $root "component" "rollout" "affinity" $r.affinity)) }}
{{- $checksum := include "specrl.configChecksum" (dict "root" $root "file" "rollout") -}}
metadata:
  {{- include "specrl.podMeta" (dict "root" $root "component" "rollout" "extraLabels" $extra "checksum" $checksum) | nindent 2 }}
spec:
  {{- include "specrl.podCommon" (dict "root" $root "affinity" $affinity "role" "rollout") | nindent 2 }}
  {{- /* leader and workers alike: every engine worker is a member of the policy and
  draft broadcast groups (weightsync/group.py) */}}
  {{- include "specrl.nvlinkClaims" $root | nindent 2 }}
  containers:
    {{- if eq .role "worker" }}
    - name: rollout-worker
      {{- include "specrl.containerCommon" (dict "root" $root "image" $r.image "gpus" (div (int $r.gpusPerReplica) $nodes)) | nindent 6 }}
      args: [serve, rollout-worker, --config, /etc/specrl/rollout.yaml]
    {{- else }}
    - name: rollout
      {{- include "specrl.containerCommon" (dict "root" $root "image" $r.image "gpus" (div (int $r.gpusPerReplica) $nodes)) | nindent 6 }}
      args: [serve, rollout, --config, /etc/specrl/rollout.yaml]
      ports:
        - name: grpc
          containerPort: {{ $r.port }}
        - name: metrics
          containerPort: {{ $r.metricsPort }}
        {{- if gt $nodes 1 }}
        - name: engine
          containerPort: {{ $r.enginePort }}
        {{- end }}
      {{- include "specrl.probes" (dict "root" $root "port" $r.port "startupSeconds" $r.startupSeconds) | nindent 6 }}
    {{- end }}
      resources:
        {{- include "specrl.resources" (dict "root" $root "resources" $r.resources "gpus" (div (int $r.gpusPerReplica) $nodes)) | nindent 8 }}
        {{- include "specrl.nvlinkContainerClaims" $root | nindent 8 }}
      volumeMounts:
        {{- include "specrl.volumeMounts" (dict "root" $root "runs" false) | nindent 8 }}
  volumes:
    {{- include "specrl.volumes" (dict "root" $root "runs" false "component" "rollout") | nindent 4 }}
{{- end }}
