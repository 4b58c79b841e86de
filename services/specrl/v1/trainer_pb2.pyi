from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RolloutSample(_message.Message):
    __slots__ = ("prompt_ids", "completion_ids", "reward", "rollout_logprobs", "policy_version")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_IDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    completion_ids: _containers.RepeatedScalarFieldContainer[int]
    reward: float
    rollout_logprobs: _containers.RepeatedScalarFieldContainer[float]
    policy_version: int
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., completion_ids: _Optional[_Iterable[int]] = ..., reward: _Optional[float] = ..., rollout_logprobs: _Optional[_Iterable[float]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class ComputeLogprobsRequest(_message.Message):
    __slots__ = ("samples", "reference")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[RolloutSample]
    reference: bool
    def __init__(self, samples: _Optional[_Iterable[_Union[RolloutSample, _Mapping]]] = ..., reference: _Optional[bool] = ...) -> None: ...

class CompletionLogprobs(_message.Message):
    __slots__ = ("logprobs",)
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Mismatch(_message.Message):
    __slots__ = ("kl", "max_abs", "tokens")
    KL_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    kl: float
    max_abs: float
    tokens: int
    def __init__(self, kl: _Optional[float] = ..., max_abs: _Optional[float] = ..., tokens: _Optional[int] = ...) -> None: ...

class ComputeLogprobsResponse(_message.Message):
    __slots__ = ("completions", "mismatch", "seconds")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[CompletionLogprobs]
    mismatch: Mismatch
    seconds: float
    def __init__(self, completions: _Optional[_Iterable[_Union[CompletionLogprobs, _Mapping]]] = ..., mismatch: _Optional[_Union[Mismatch, _Mapping]] = ..., seconds: _Optional[float] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("inline", "batch_ref", "group_size")
    INLINE_FIELD_NUMBER: _ClassVar[int]
    BATCH_REF_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    inline: TrainBatch
    batch_ref: str
    group_size: int
    def __init__(self, inline: _Optional[_Union[TrainBatch, _Mapping]] = ..., batch_ref: _Optional[str] = ..., group_size: _Optional[int] = ...) -> None: ...

class TrainBatch(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[RolloutSample]
    def __init__(self, samples: _Optional[_Iterable[_Union[RolloutSample, _Mapping]]] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("stats", "tokens", "logprob_seconds", "train_seconds", "advantages_nonzero", "mismatch")
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STATS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_NONZERO_FIELD_NUMBER: _ClassVar[int]
    MISMATCH_FIELD_NUMBER: _ClassVar[int]
    stats: _containers.ScalarMap[str, float]
    tokens: int
    logprob_seconds: float
    train_seconds: float
    advantages_nonzero: float
    mismatch: Mismatch
    def __init__(self, stats: _Optional[_Mapping[str, float]] = ..., tokens: _Optional[int] = ..., logprob_seconds: _Optional[float] = ..., train_seconds: _Optional[float] = ..., advantages_nonzero: _Optional[float] = ..., mismatch: _Optional[_Union[Mismatch, _Mapping]] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("metrics", "step")
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    metrics: StepMetrics
    step: int
    def __init__(self, metrics: _Optional[_Union[StepMetrics, _Mapping]] = ..., step: _Optional[int] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "step", "hf_path")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    HF_PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    hf_path: str
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ..., hf_path: _Optional[str] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: int
    def __init__(self, step: _Optional[int] = ...) -> None: ...

class FindCheckpointRequest(_message.Message):
    __slots__ = ("directory",)
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    directory: str
    def __init__(self, directory: _Optional[str] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("path", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class GetTrainerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerStatus(_message.Message):
    __slots__ = ("model", "tp", "dp", "step", "capture_enabled", "capture_queue", "capture_dropped")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    DP_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_ENABLED_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_DROPPED_FIELD_NUMBER: _ClassVar[int]
    model: str
    tp: int
    dp: int
    step: int
    capture_enabled: bool
    capture_queue: int
    capture_dropped: int
    def __init__(self, model: _Optional[str] = ..., tp: _Optional[int] = ..., dp: _Optional[int] = ..., step: _Optional[int] = ..., capture_enabled: _Optional[bool] = ..., capture_queue: _Optional[int] = ..., capture_dropped: _Optional[int] = ...) -> None: ...

class PushWeightsRequest(_message.Message):
    __slots__ = ("replicas", "rewind")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REWIND_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[str]
    rewind: bool
    def __init__(self, replicas: _Optional[_Iterable[str]] = ..., rewind: _Optional[bool] = ...) -> None: ...

class PushWeightsResponse(_message.Message):
    __slots__ = ("version", "updated", "dropped", "bytes", "seconds", "phases")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PhasesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    version: int
    updated: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.ScalarMap[str, str]
    bytes: int
    seconds: float
    phases: _containers.ScalarMap[str, float]
    def __init__(self, version: _Optional[int] = ..., updated: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Mapping[str, str]] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., phases: _Optional[_Mapping[str, float]] = ...) -> None: ...

class StreamCapturesRequest(_message.Message):
    __slots__ = ("max_batches",)
    MAX_BATCHES_FIELD_NUMBER: _ClassVar[int]
    max_batches: int
    def __init__(self, max_batches: _Optional[int] = ...) -> None: ...

class CapturedBatch(_message.Message):
    __slots__ = ("policy_version", "aux_layer_ids", "tensors")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    AUX_LAYER_IDS_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    aux_layer_ids: _containers.RepeatedScalarFieldContainer[int]
    tensors: bytes
    def __init__(self, policy_version: _Optional[int] = ..., aux_layer_ids: _Optional[_Iterable[int]] = ..., tensors: _Optional[bytes] = ...) -> None: ...
