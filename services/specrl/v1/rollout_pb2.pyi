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
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: bytes
    token_ids: TokenIds
    def __init__(self, text: _Optional[bytes] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "n", "seed", "stop", "ignore_eos")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    n: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., n: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("engine", "engine_version", "model", "speculation_method", "num_speculative_tokens", "draft_model", "policy_version", "draft_version", "self_test_passed", "self_test_p_value", "self_test_detail", "requests_in_flight", "max_model_len", "vocab_size", "engine_patches")
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
    def __init__(self, engine: _Optional[str] = ..., engine_version: _Optional[str] = ..., model: _Optional[str] = ..., speculation_method: _Optional[str] = ..., num_speculative_tokens: _Optional[int] = ..., draft_model: _Optional[str] = ..., policy_version: _Optional[int] = ..., draft_version: _Optional[int] = ..., self_test_passed: _Optional[bool] = ..., self_test_p_value: _Optional[float] = ..., self_test_detail: _Optional[str] = ..., requests_in_flight: _Optional[int] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., engine_patches: _Optional[_Iterable[str]] = ...) -> None: ...
