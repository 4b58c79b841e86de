{{/* Each service's config file, as the ConfigMap holds it (configmap.yaml): that
component's `config` values plus what the chart decides (bind address, ports, peers,
rendezvous hosts, the run directory). One define per file, so that each workload's pod
template carries the checksum of its own file only (specrl.configChecksum). */}}

{{- define "specrl.config.rollout" -}}
{{- $rollout := deepCopy .Values.rollout.config }}
{{- $_ := set $rollout "host" "0.0.0.0" }}
{{- $_ := set $rollout "port" (int .Values.rollout.port) }}
{{- $_ := set $rollout "metrics_port" (int .Values.rollout.metricsPort) }}
{{- $nodes := int (include "specrl.rolloutNodes" .) }}
{{- if gt $nodes 1 }}
{{- /* the leader's address comes from LeaderWorkerSet's LWS_LEADER_ADDRESS in each pod */}}
{{- $engine := default dict $rollout.engine }}
{{- $_ := set $engine "nnodes" $nodes }}
{{- $_ := set $engine "master_port" (int .Values.rollout.enginePort) }}
{{- $_ := set $rollout "engine" $engine }}
{{- end }}
{{- toYaml $rollout }}
{{- end }}

{{- define "specrl.config.trainer" -}}
{{- $trainer := deepCopy .Values.trainer.config }}
{{- $_ := set $trainer "host" "0.0.0.0" }}
{{- $_ := set $trainer "port" (int .Values.trainer.port) }}
{{- $_ := set $trainer "metrics_port" (int .Values.trainer.metricsPort) }}
{{- $sync := default dict $trainer.weight_sync }}
{{- $_ := set $sync "host" (include "specrl.trainerMaster" .) }}
{{- $_ := set $sync "port" (int .Values.trainer.weightSyncPort) }}
{{- $_ := set $trainer "weight_sync" $sync }}
{{- if .Values.draftTrainer.enabled }}
{{- $capture := default dict $trainer.trainer.capture }}
{{- $_ := set $capture "enabled" true }}
{{- $_ := set $trainer.trainer "capture" $capture }}
{{- end }}
{{- toYaml $trainer }}
{{- end }}

{{- define "specrl.config.draftTrainer" -}}
{{- $runDir := include "specrl.runDir" . }}
{{- $draft := deepCopy .Values.draftTrainer.config }}
{{- $_ := set $draft "host" "0.0.0.0" }}
{{- $_ := set $draft "port" (int .Values.draftTrainer.port) }}
{{- $_ := set $draft "metrics_port" (int .Values.draftTrainer.metricsPort) }}
{{- $_ := set $draft "trainer" (printf "%s:%d" (include "specrl.svc" (dict "root" . "component" "trainer")) (int .Values.trainer.port)) }}
{{- if not $draft.draft }}
{{- $_ := set $draft "draft" (required "draftTrainer needs a draft: rollout.config.speculation.draft or draftTrainer.config.draft" .Values.rollout.config.speculation.draft) }}
{{- end }}
{{- if not $draft.target }}
{{- /* the trainer's base model: given, the draft-trainer starts without asking the trainer (whose pod may not serve yet) */}}
{{- $_ := set $draft "target" .Values.trainer.config.trainer.model }}
{{- end }}
{{- if not $draft.save_dir }}
{{- $_ := set $draft "save_dir" (printf "%s/draft" $runDir) }}
{{- end }}
{{- $dsync := default dict $draft.weight_sync }}
{{- $_ := set $dsync "kind" "draft" }}
{{- $_ := set $dsync "host" (include "specrl.podHost" (dict "root" . "component" "draft-trainer" "index" 0)) }}
{{- $_ := set $dsync "port" (int .Values.draftTrainer.weightSyncPort) }}
{{- $_ := set $draft "weight_sync" $dsync }}
{{- toYaml $draft }}
{{- end }}

{{- define "specrl.config.run" -}}
{{- $run := deepCopy .Values.orchestrator.config }}
{{- $_ := set $run "output_dir" (printf "%s/{name}" .Values.runs.mountPath) }}
{{- $loop := default dict $run.orchestrator }}
{{- $_ := set $loop "metrics_port" (int .Values.orchestrator.metricsPort) }}
{{- $_ := set $loop "status_port" (int .Values.orchestrator.statusPort) }}
{{- $_ := set $loop "control_token_env" "SPECRL_CONTROL_TOKEN" }}
{{- $_ := set $run "orchestrator" $loop }}
{{- $redis := dict "url" (include "specrl.redisUrl" .) }}
{{- if include "specrl.redisAuth" . }}
{{- $_ := set $redis "password_env" "SPECRL_REDIS_PASSWORD" }}
{{- end }}
{{- $_ := set $run "redis" $redis }}
{{- /* the rollout pods, found again while the run goes on: they scale under it */}}
{{- $fleet := dict "replicas" 0 "discover" (include "specrl.rolloutDiscover" .) }}
{{- with .Values.rollout.orchestratorScaling }}
{{- if .enabled }}
{{- /* the orchestrator scales them itself, through the workload's scale subresource */}}
{{- $w := fromJson (include "specrl.rolloutWorkload" $) }}
{{- $_ := set $fleet "autoscale" (dict
  "enabled" true
  "workload" (printf "%s/%s-rollout" $w.resource (include "specrl.fullname" $))
  "namespace" $.Release.Namespace
  "min_replicas" (int .minReplicas)
  "max_replicas" (int .maxReplicas)
  "target_exposed_share" (float64 .targetExposedShare)
  "tolerance" (float64 .tolerance)
  "window_steps" (int .windowSteps)
  "max_factor" (float64 .maxFactor)) }}
{{- end }}
{{- end }}
{{- $_ := set $run "rollout" $fleet }}
{{- $_ := set $run "trainer" (dict "address" (printf "%s:%d" (include "specrl.svc" (dict "root" . "component" "trainer")) (int .Values.trainer.port))) }}
{{- if .Values.draftTrainer.enabled }}
{{- $_ := set $run "draft_trainer" (dict "enabled" true "address" (printf "%s:%d" (include "specrl.svc" (dict "root" . "component" "draft-trainer")) (int .Values.draftTrainer.port))) }}
{{- end }}
{{- toYaml $run }}
{{- end }}

{{/* The checksum a workload's pod template carries: its own config file (`file`: rollout,
trainer, draftTrainer, run) and `extra` (what else it mounts that the chart renders):
(dict "root" $ "file" ... "extra" ...) */}}
{{- define "specrl.configChecksum" -}}
{{- printf "%s\n%s" (include (printf "specrl.config.%s" .file) .root) (default "" .extra) | sha256sum }}
{{- end }}
