from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class WeightKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_KIND_UNSPECIFIED: _ClassVar[WeightKind]
    WEIGHT_KIND_POLICY: _ClassVar[WeightKind]
    WEIGHT_KIND_DRAFT: _ClassVar[WeightKind]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
WEIGHT_KIND_UNSPECIFIED: WeightKind
WEIGHT_KIND_POLICY: WeightKind
WEIGHT_KIND_DRAFT: WeightKind

class KRange(_message.Message):
    __slots__ = ("first", "last", "k")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    k: int
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ..., k: _Optional[int] = ...) -> None: ...

class SetSpeculationRequest(_message.Message):
    __slots__ = ("k_schedule",)
    K_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    k_schedule: _containers.RepeatedCompositeFieldContainer[KRange]
    def __init__(self, k_schedule: _Optional[_Iterable[_Union[KRange, _Mapping]]] = ...) -> None: ...

class SpeculationState(_message.Message):
    __slots__ = ("k_schedule", "adaptive", "drafter_paused", "history", "history_rows", "model_rows", "history_tokens", "first_pass_only_steps", "long_draft_steps", "left_out_rows", "padded_steps", "extended_rows")
    K_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_PAUSED_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    HISTORY_ROWS_FIELD_NUMBER: _ClassVar[int]
    MODEL_ROWS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_PASS_ONLY_STEPS_FIELD_NUMBER: _ClassVar[int]
    LONG_DRAFT_STEPS_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_ROWS_FIELD_NUMBER: _ClassVar[int]
    PADDED_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXTENDED_ROWS_FIELD_NUMBER: _ClassVar[int]
    k_schedule: _containers.RepeatedCompositeFieldContainer[KRange]
    adaptive: bool
    drafter_paused: bool
    history: bool
    history_rows: int
    model_rows: int
    history_tokens: int
    first_pass_only_steps: int
    long_draft_steps: int
    left_out_rows: int
    padded_steps: int
    extended_rows: int
    def __init__(self, k_schedule: _Optional[_Iterable[_Union[KRange, _Mapping]]] = ..., adaptive: _Optional[bool] = ..., drafter_paused: _Optional[bool] = ..., history: _Optional[bool] = ..., history_rows: _Optional[int] = ..., model_rows: _Optional[int] = ..., history_tokens: _Optional[int] = ..., first_pass_only_steps: _Optional[int] = ..., long_draft_steps: _Optional[int] = ..., left_out_rows: _Optional[int] = ..., padded_steps: _Optional[int] = ..., extended_rows: _Optional[int] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("text", "token_ids", "history")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    text: bytes
    token_ids: TokenIds
    history: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, text: _Optional[bytes] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., history: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "n", "seed", "stop", "ignore_eos", "stop_token_ids")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    n: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling", "request_id", "return_text")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RETURN_TEXT_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    sampling: SamplingParams
    request_id: str
    return_text: bool
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ..., return_text: _Optional[bool] = ...) -> None: ...

class AcceptanceStats(_message.Message):
    __slots__ = ("drafts", "draft_tokens", "accepted_tokens", "accepted_per_position", "acceptance_length")
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: _containers.RepeatedScalarFieldContainer[int]
    acceptance_length: float
    def __init__(self, drafts: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ..., accepted_per_position: _Optional[_Iterable[int]] = ..., acceptance_length: _Optional[float] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("prompt_index", "sample_index", "token_ids", "logprobs", "text", "finish_reason", "policy_version", "draft_version", "acceptance", "prompt_tokens")
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_index: int
    sample_index: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    text: str
    finish_reason: FinishReason
    policy_version: int
    draft_version: int
    acceptance: AcceptanceStats
    prompt_tokens: int
    def __init__(self, prompt_index: _Optional[int] = ..., sample_index: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., policy_version: _Optional[int] = ..., draft_version: _Optional[int] = ..., acceptance: _Optional[_Union[AcceptanceStats, _Mapping]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("samples", "seconds")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    seconds: float
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., seconds: _Optional[float] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("engine", "engine_version", "model", "speculation_method", "num_speculative_tokens", "draft_model", "policy_version", "draft_version", "self_test_passed", "self_test_p_value", "self_test_detail", "requests_in_flight", "max_model_len", "vocab_size", "engine_patches", "weight_sync_workers", "weight_sync", "speculation", "tokens_generated", "max_num_seqs", "instance")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_METHOD_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    SELF_TEST_PASSED_FIELD_NUMBER: _ClassVar[int]
    SELF_TEST_P_VALUE_FIELD_NUMBER: _ClassVar[int]
    SELF_TEST_DETAIL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_PATCHES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_WORKERS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    engine_version: str
    model: str
    speculation_method: str
    num_speculative_tokens: int
    draft_model: str
    policy_version: int
    draft_version: int
    self_test_passed: bool
    self_test_p_value: float
    self_test_detail: str
    requests_in_flight: int
    max_model_len: int
    vocab_size: int
    engine_patches: _containers.RepeatedScalarFieldContainer[str]
    weight_sync_workers: int
    weight_sync: WeightSyncState
    speculation: SpeculationState
    tokens_generated: int
    max_num_seqs: int
    instance: str
    def __init__(self, engine: _Optional[str] = ..., engine_version: _Optional[str] = ..., model: _Optional[str] = ..., speculation_method: _Optional[str] = ..., num_speculative_tokens: _Optional[int] = ..., draft_model: _Optional[str] = ..., policy_version: _Optional[int] = ..., draft_version: _Optional[int] = ..., self_test_passed: _Optional[bool] = ..., self_test_p_value: _Optional[float] = ..., self_test_detail: _Optional[str] = ..., requests_in_flight: _Optional[int] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., engine_patches: _Optional[_Iterable[str]] = ..., weight_sync_workers: _Optional[int] = ..., weight_sync: _Optional[_Union[WeightSyncState, _Mapping]] = ..., speculation: _Optional[_Union[SpeculationState, _Mapping]] = ..., tokens_generated: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., instance: _Optional[str] = ...) -> None: ...

class JoinWeightGroupRequest(_message.Message):
    __slots__ = ("kind", "epoch", "store_host", "store_port", "rank_offset", "world_size", "backend", "timeout_s")
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    RANK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    kind: WeightKind
    epoch: int
    store_host: str
    store_port: int
    rank_offset: int
    world_size: int
    backend: str
    timeout_s: float
    def __init__(self, kind: _Optional[_Union[WeightKind, str]] = ..., epoch: _Optional[int] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., rank_offset: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class JoinWeightGroupResponse(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype", "bucket", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    bucket: int
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., bucket: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class WeightManifest(_message.Message):
    __slots__ = ("tensors", "bucket_bytes")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    bucket_bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., bucket_bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class BeginWeightUpdateRequest(_message.Message):
    __slots__ = ("kind", "version", "epoch", "manifest", "policy_version", "rewind")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWIND_FIELD_NUMBER: _ClassVar[int]
    kind: WeightKind
    version: int
    epoch: int
    manifest: WeightManifest
    policy_version: int
    rewind: bool
    def __init__(self, kind: _Optional[_Union[WeightKind, str]] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ..., manifest: _Optional[_Union[WeightManifest, _Mapping]] = ..., policy_version: _Optional[int] = ..., rewind: _Optional[bool] = ...) -> None: ...

class CommitWeightUpdateRequest(_message.Message):
    __slots__ = ("kind", "version")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    kind: WeightKind
    version: int
    def __init__(self, kind: _Optional[_Union[WeightKind, str]] = ..., version: _Optional[int] = ...) -> None: ...

class AbortWeightUpdateRequest(_message.Message):
    __slots__ = ("kind", "version", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: WeightKind
    version: int
    reason: str
    def __init__(self, kind: _Optional[_Union[WeightKind, str]] = ..., version: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class WeightSyncState(_message.Message):
    __slots__ = ("policy_version", "draft_version", "draft_policy_version", "ready", "detail", "state", "policy_epoch", "draft_epoch", "last_seconds", "last_bytes", "pending_kind", "last_load_seconds", "last_wait_seconds")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DRAFT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_BYTES_FIELD_NUMBER: _ClassVar[int]
    PENDING_KIND_FIELD_NUMBER: _ClassVar[int]
    LAST_LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    draft_version: int
    draft_policy_version: int
    ready: bool
    detail: str
    state: str
    policy_epoch: int
    draft_epoch: int
    last_seconds: float
    last_bytes: int
    pending_kind: str
    last_load_seconds: float
    last_wait_seconds: float
    def __init__(self, policy_version: _Optional[int] = ..., draft_version: _Optional[int] = ..., draft_policy_version: _Optional[int] = ..., ready: _Optional[bool] = ..., detail: _Optional[str] = ..., state: _Optional[str] = ..., policy_epoch: _Optional[int] = ..., draft_epoch: _Optional[int] = ..., last_seconds: _Optional[float] = ..., last_bytes: _Optional[int] = ..., pending_kind: _Optional[str] = ..., last_load_seconds: _Optional[float] = ..., last_wait_seconds: _Optional[float] = ...) -> None: ...
