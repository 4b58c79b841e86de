{{/* The trainer's rendezvous host (rank 0's pod, through the headless Service): the
StatefulSet's pod 0, or the JobSet's first pod (<jobset>-<replicated job>-<job>-<pod>). */}}
{{- define "specrl.trainerMaster" -}}
{{- $full := include "specrl.fullname" . }}
{{- if eq .Values.trainer.workload "jobset" }}
{{- printf "%s-trainer-ranks-0-0.%s-trainer-headless.%s.svc" $full $full .Release.Namespace }}
{{- else }}
{{- include "specrl.podHost" (dict "root" . "component" "trainer" "index" 0) }}
{{- end }}
{{- end }}

{{/* The trainer's pod template, for the StatefulSet and the JobSet alike:
(dict "root" $ "affinity" ... "master" host "world" ranks "jobset" bool) */}}
{{- define "specrl.trainerPod" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $t := $v.trainer }}
{{- $full := include "specrl.fullname" $root }}
{{- $ctx := dict "root" $root "component" "trainer" }}
{{- /* node rank: the pod's index in its StatefulSet, or its completion index in the Job */}}
{{- $rank := "metadata.labels['apps.kubernetes.io/pod-index']" }}
{{- if .jobset }}
{{- $rank = "metadata.annotations['batch.kubernetes.io/job-completion-index']" }}
{{- end }}
{{- $extra := dict }}
{{- if $t.scheduling.podGroup }}
{{- $_ := set $extra "scheduling.x-k8s.io/pod-group" (printf "%s-trainer" $full) }}
{{- end }}
{{- $checksum := include "specrl.configChecksum" (dict "root" $root "file" "trainer") -}}
metadata:
  {{- include "specrl.podMeta" (merge (dict "extraLabels" $extra "checksum" $checksum) $ctx) | nindent 2 }}
spec:
  {{- include "specrl.podCommon" (dict "root" $root "affinity" .affinity "role" "trainer") | nindent 2 }}
  {{- if .jobset }}
  restartPolicy: Never  # a failed rank fails the gang; the JobSet restarts it whole
  {{- end }}
  {{- with $t.scheduling.schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- include "specrl.nvlinkClaims" $root | nindent 2 }}
  containers:
    - name: trainer
      {{- $env := list (dict "name" "NODE_RANK" "valueFrom" (dict "fieldRef" (dict "fieldPath" $rank))) }}
      {{- include "specrl.containerCommon" (dict "root" $root "image" $t.image "env" $env "gpus" $t.gpusPerNode) | nindent 6 }}
      {{- if eq (int .world) 1 }}
      args: [serve, trainer, --config, /etc/specrl/trainer.yaml]
      {{- else }}
      command: [torchrun]
      args:
        - --nnodes={{ $t.nodes }}
        - --nproc-per-node={{ $t.procsPerNode }}
        - --node-rank=$(NODE_RANK)
        - --master-addr={{ .master }}
        - --master-port={{ $t.rendezvousPort }}
        - -m
        - specrl.cli
        - serve
        - trainer
        - --config
        - /etc/specrl/trainer.yaml
      {{- end }}
      ports:
        - name: grpc
          containerPort: {{ $t.port }}
        - name: rendezvous
          containerPort: {{ $t.rendezvousPort }}
        - name: weight-sync
          containerPort: {{ $t.weightSyncPort }}
        - name: metrics
          containerPort: {{ $t.metricsPort }}
      {{- /* several pods: only rank 0's serves gRPC, so no pod-level gRPC probe; the
      orchestrator checks the trainer's health before it starts */}}
      {{- if eq (int $t.nodes) 1 }}
      {{- include "specrl.probes" (dict "root" $root "port" $t.port "startupSeconds" $t.startupSeconds) | nindent 6 }}
      {{- end }}
      resources:
        {{- include "specrl.resources" (dict "root" $root "resources" $t.resources "gpus" $t.gpusPerNode) | nindent 8 }}
        {{- include "specrl.nvlinkContainerClaims" $root | nindent 8 }}
      volumeMounts:
        {{- include "specrl.volumeMounts" (dict "root" $root "runs" true) | nindent 8 }}
  volumes:
    {{- include "specrl.volumes" (dict "root" $root "runs" true "component" "trainer") | nindent 4 }}
{{- end }}
