from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GetDraftStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DraftStatus(_message.Message):
    __slots__ = ("draft", "trainer", "steps", "tokens", "refused", "last_error", "last_loss", "policy_version", "agreement", "acceptance_estimate", "published_version", "published_policy_version", "streaming", "detail")
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_LOSS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_VERSION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    draft: str
    trainer: str
    steps: int
    tokens: int
    refused: int
    last_error: str
    last_loss: float
    policy_version: int
    agreement: _containers.RepeatedScalarFieldContainer[float]
    acceptance_estimate: float
    published_version: int
    published_policy_version: int
    streaming: bool
    detail: str
    def __init__(self, draft: _Optional[str] = ..., trainer: _Optional[str] = ..., steps: _Optional[int] = ..., tokens: _Optional[int] = ..., refused: _Optional[int] = ..., last_error: _Optional[str] = ..., last_loss: _Optional[float] = ..., policy_version: _Optional[int] = ..., agreement: _Optional[_Iterable[float]] = ..., acceptance_estimate: _Optional[float] = ..., published_version: _Optional[int] = ..., published_policy_version: _Optional[int] = ..., streaming: _Optional[bool] = ..., detail: _Optional[str] = ...) -> None: ...

class PushDraftRequest(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class PushDraftResponse(_message.Message):
    __slots__ = ("version", "policy_version", "updated", "dropped", "bytes", "seconds", "phases", "held_back", "acceptance_estimate", "candidate_estimate")
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
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    HELD_BACK_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    version: int
    policy_version: int
    updated: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.ScalarMap[str, str]
    bytes: int
    seconds: float
    phases: _containers.ScalarMap[str, float]
    held_back: str
    acceptance_estimate: float
    candidate_estimate: float
    def __init__(self, version: _Optional[int] = ..., policy_version: _Optional[int] = ..., updated: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Mapping[str, str]] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., phases: _Optional[_Mapping[str, float]] = ..., held_back: _Optional[str] = ..., acceptance_estimate: _Optional[float] = ..., candidate_estimate: _Optional[float] = ...) -> None: ...
