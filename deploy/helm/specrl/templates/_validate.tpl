{{/* Rules across values that JSON schema (values.schema.json) cannot state, checked
once before anything renders (validate.yaml): each refusal names the values involved.
Every one of them was accepted before and broken on a GB200 NVL72 rack. */}}
{{- define "specrl.validate" -}}
{{- $v := .Values }}
{{- $perNode := int $v.gpu.perNode }}
{{- $t := $v.trainer }}
{{- $gpus := int $t.gpusPerNode }}
{{- $procs := int $t.procsPerNode }}
{{- $tconfig := default dict $t.config }}
{{- $sync := default dict $tconfig.weight_sync }}
{{- $tp := int (default 1 (default dict $tconfig.trainer).tp) }}

{{- if and $v.tls.enabled (not (or $v.tls.existingSecret $v.tls.certManager.enabled)) }}
{{- fail "tls.enabled needs tls.existingSecret or tls.certManager.enabled" }}
{{- end }}

{{- /* No pod asks for more GPUs than a node has: it would stay Pending forever. */}}
{{- if gt $gpus $perNode }}
{{- fail (printf "trainer.gpusPerNode (%d) is more than gpu.perNode (%d): a trainer pod runs on one node; spread the ranks over more trainer.nodes" $gpus $perNode) }}
{{- end }}
{{- $rolloutGpus := int $v.rollout.gpusPerReplica }}
{{- $rolloutPods := int (default 1 $v.rollout.podsPerReplica) }}
{{- if gt $rolloutGpus 0 }}
{{- if mod $rolloutGpus $rolloutPods }}
{{- fail (printf "rollout.gpusPerReplica (%d) must split evenly over rollout.podsPerReplica (%d)" $rolloutGpus $rolloutPods) }}
{{- end }}
{{- if gt (div $rolloutGpus $rolloutPods) $perNode }}
{{- fail (printf "rollout.gpusPerReplica / rollout.podsPerReplica (%d GPUs per pod) is more than gpu.perNode (%d): raise rollout.podsPerReplica so that each pod fits a node" (div $rolloutGpus $rolloutPods) $perNode) }}
{{- end }}
{{- end }}
{{- if and $v.draftTrainer.enabled (gt (int $v.draftTrainer.gpus) $perNode) }}
{{- fail (printf "draftTrainer.gpus (%d) is more than gpu.perNode (%d)" (int $v.draftTrainer.gpus) $perNode) }}
{{- end }}

{{- /* One rank per GPU: two ranks on one GPU stop NCCL ("Duplicate GPU detected"), a GPU
without a rank idles. */}}
{{- if and (gt $gpus 0) (ne $procs $gpus) }}
{{- fail (printf "trainer.procsPerNode (%d) must equal trainer.gpusPerNode (%d): one rank per GPU" $procs $gpus) }}
{{- end }}

{{- /* What needs GPUs, given a trainer without any. */}}
{{- if eq $gpus 0 }}
{{- if eq (toString $sync.backend) "nccl" }}
{{- fail "trainer.gpusPerNode is 0 but trainer.config.weight_sync.backend is nccl: NCCL needs a GPU per rank (gloo or auto on CPU)" }}
{{- end }}
{{- if $v.nvlink.computeDomain.enabled }}
{{- fail "trainer.gpusPerNode is 0 but nvlink.computeDomain.enabled: IMEX channels are for multi-node NVLink between GPUs" }}
{{- end }}
{{- if $v.nvlink.rdmaResources }}
{{- fail "trainer.gpusPerNode is 0 but nvlink.rdmaResources is set: RDMA devices go to GPU pods only" }}
{{- end }}
{{- end }}

{{- /* One scaler owns the rollout's replica count: two would fight over it (each
undoing the other's change). */}}
{{- $r := $v.rollout }}
{{- $scalers := list }}
{{- if $r.autoscaling.enabled }}{{ $scalers = append $scalers "rollout.autoscaling (HorizontalPodAutoscaler)" }}{{ end }}
{{- if $r.keda.enabled }}{{ $scalers = append $scalers "rollout.keda" }}{{ end }}
{{- if $r.orchestratorScaling.enabled }}{{ $scalers = append $scalers "rollout.orchestratorScaling" }}{{ end }}
{{- if gt (len $scalers) 1 }}
{{- fail (printf "%s both scale the rollout replicas: enable one" (join " and " $scalers)) }}
{{- end }}
{{- with $r.orchestratorScaling }}
{{- if and .enabled (gt (int .minReplicas) (int .maxReplicas)) }}
{{- fail (printf "rollout.orchestratorScaling.minReplicas (%d) is more than its maxReplicas (%d)" (int .minReplicas) (int .maxReplicas)) }}
{{- end }}
{{- end }}

{{- /* A tensor-parallel group inside one pod (NVLink within the node), or over whole
pods; never straddling part of one pod and part of the next. */}}
{{- if not (or (eq 0 (mod $procs $tp)) (eq 0 (mod $tp $procs))) }}
{{- fail (printf "trainer.config.trainer.tp (%d) must divide trainer.procsPerNode (%d) or be a multiple of it: a tensor-parallel group would straddle two pods" $tp $procs) }}
{{- end }}
{{- end }}
