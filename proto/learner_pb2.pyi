from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT16: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    BOOL: _ClassVar[DType]

class ActorMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRAIN: _ClassVar[ActorMode]
    EVAL: _ClassVar[ActorMode]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType
FLOAT16: DType
INT8: DType
INT16: DType
INT32: DType
INT64: DType
UINT8: DType
BOOL: DType
TRAIN: ActorMode
EVAL: ActorMode

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Handshake(_message.Message):
    __slots__ = ("protocol_version", "problem", "actor_id", "num_envs", "observation_spec", "action_spec", "mode", "extra_spec")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPEC_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPEC_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    EXTRA_SPEC_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    problem: str
    actor_id: str
    num_envs: int
    observation_spec: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    action_spec: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    mode: ActorMode
    extra_spec: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    def __init__(self, protocol_version: _Optional[int] = ..., problem: _Optional[str] = ..., actor_id: _Optional[str] = ..., num_envs: _Optional[int] = ..., observation_spec: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., action_spec: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., mode: _Optional[_Union[ActorMode, str]] = ..., extra_spec: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ...) -> None: ...

class EpisodeStats(_message.Message):
    __slots__ = ("env_index", "metrics", "eval_episode", "images", "group", "record")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENV_INDEX_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    EVAL_EPISODE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    env_index: int
    metrics: _containers.ScalarMap[str, float]
    eval_episode: int
    images: _containers.RepeatedCompositeFieldContainer[Tensor]
    group: str
    record: bytes
    def __init__(self, env_index: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., eval_episode: _Optional[int] = ..., images: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., group: _Optional[str] = ..., record: _Optional[bytes] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("env_indices", "run_ids", "observations", "rewards", "terminated", "truncated", "finished_episodes", "extras", "sequence")
    ENV_INDICES_FIELD_NUMBER: _ClassVar[int]
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EXTRAS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    env_indices: _containers.RepeatedScalarFieldContainer[int]
    run_ids: _containers.RepeatedScalarFieldContainer[int]
    observations: _containers.RepeatedCompositeFieldContainer[Tensor]
    rewards: _containers.RepeatedScalarFieldContainer[float]
    terminated: _containers.RepeatedScalarFieldContainer[bool]
    truncated: _containers.RepeatedScalarFieldContainer[bool]
    finished_episodes: _containers.RepeatedCompositeFieldContainer[EpisodeStats]
    extras: _containers.RepeatedCompositeFieldContainer[Tensor]
    sequence: int
    def __init__(self, env_indices: _Optional[_Iterable[int]] = ..., run_ids: _Optional[_Iterable[int]] = ..., observations: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., rewards: _Optional[_Iterable[float]] = ..., terminated: _Optional[_Iterable[bool]] = ..., truncated: _Optional[_Iterable[bool]] = ..., finished_episodes: _Optional[_Iterable[_Union[EpisodeStats, _Mapping]]] = ..., extras: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., sequence: _Optional[int] = ...) -> None: ...

class ActorMessage(_message.Message):
    __slots__ = ("handshake", "step")
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    handshake: Handshake
    step: Step
    def __init__(self, handshake: _Optional[_Union[Handshake, _Mapping]] = ..., step: _Optional[_Union[Step, _Mapping]] = ...) -> None: ...

class HandshakeAccepted(_message.Message):
    __slots__ = ("run_name", "policy_version")
    RUN_NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    run_name: str
    policy_version: int
    def __init__(self, run_name: _Optional[str] = ..., policy_version: _Optional[int] = ...) -> None: ...

class Actions(_message.Message):
    __slots__ = ("actions", "policy_version")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[Tensor]
    policy_version: int
    def __init__(self, actions: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class RunFinished(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class LearnerMessage(_message.Message):
    __slots__ = ("accepted", "actions", "finished")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    accepted: HandshakeAccepted
    actions: Actions
    finished: RunFinished
    def __init__(self, accepted: _Optional[_Union[HandshakeAccepted, _Mapping]] = ..., actions: _Optional[_Union[Actions, _Mapping]] = ..., finished: _Optional[_Union[RunFinished, _Mapping]] = ...) -> None: ...

class RunInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunInfo(_message.Message):
    __slots__ = ("protocol_version", "problem", "hparams", "observation_spec", "action_spec", "extra_spec", "num_envs_multiple", "max_envs_per_actor", "episode_groups", "max_message_bytes", "handshake_timeout_s", "episode_metrics", "eval_metrics", "undeclared_metric_slots", "metric_bound", "max_metric_name_bytes")
    class HparamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    HPARAMS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPEC_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPEC_FIELD_NUMBER: _ClassVar[int]
    EXTRA_SPEC_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_MULTIPLE_FIELD_NUMBER: _ClassVar[int]
    MAX_ENVS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    EPISODE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HANDSHAKE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    EPISODE_METRICS_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRICS_FIELD_NUMBER: _ClassVar[int]
    UNDECLARED_METRIC_SLOTS_FIELD_NUMBER: _ClassVar[int]
    METRIC_BOUND_FIELD_NUMBER: _ClassVar[int]
    MAX_METRIC_NAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    problem: str
    hparams: _containers.ScalarMap[str, str]
    observation_spec: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    action_spec: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    extra_spec: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    num_envs_multiple: int
    max_envs_per_actor: int
    episode_groups: _containers.RepeatedScalarFieldContainer[str]
    max_message_bytes: int
    handshake_timeout_s: float
    episode_metrics: _containers.RepeatedScalarFieldContainer[str]
    eval_metrics: _containers.RepeatedScalarFieldContainer[str]
    undeclared_metric_slots: int
    metric_bound: float
    max_metric_name_bytes: int
    def __init__(self, protocol_version: _Optional[int] = ..., problem: _Optional[str] = ..., hparams: _Optional[_Mapping[str, str]] = ..., observation_spec: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., action_spec: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., extra_spec: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., num_envs_multiple: _Optional[int] = ..., max_envs_per_actor: _Optional[int] = ..., episode_groups: _Optional[_Iterable[str]] = ..., max_message_bytes: _Optional[int] = ..., handshake_timeout_s: _Optional[float] = ..., episode_metrics: _Optional[_Iterable[str]] = ..., eval_metrics: _Optional[_Iterable[str]] = ..., undeclared_metric_slots: _Optional[int] = ..., metric_bound: _Optional[float] = ..., max_metric_name_bytes: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Status(_message.Message):
    __slots__ = ("env_steps", "env_steps_per_s", "episodes", "mean_episode_return", "policy_lag", "trainer_steps", "connected_actors", "finished", "finished_reason", "uptime_s", "mean_inference_batch_size", "eval_policy_version", "eval_mean_return", "eval_rounds", "return_window", "resent_steps", "disputed_episodes", "unvouched_episodes", "losses", "eval_metric", "eval_metric_value")
    class LossesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_PER_S_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    MEAN_EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STEPS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_ACTORS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REASON_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_INFERENCE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EVAL_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    EVAL_MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    EVAL_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    RETURN_WINDOW_FIELD_NUMBER: _ClassVar[int]
    RESENT_STEPS_FIELD_NUMBER: _ClassVar[int]
    DISPUTED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    UNVOUCHED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    LOSSES_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRIC_FIELD_NUMBER: _ClassVar[int]
    EVAL_METRIC_VALUE_FIELD_NUMBER: _ClassVar[int]
    env_steps: int
    env_steps_per_s: float
    episodes: int
    mean_episode_return: float
    policy_lag: float
    trainer_steps: int
    connected_actors: int
    finished: bool
    finished_reason: str
    uptime_s: float
    mean_inference_batch_size: float
    eval_policy_version: int
    eval_mean_return: float
    eval_rounds: int
    return_window: int
    resent_steps: int
    disputed_episodes: int
    unvouched_episodes: int
    losses: _containers.ScalarMap[str, float]
    eval_metric: str
    eval_metric_value: float
    def __init__(self, env_steps: _Optional[int] = ..., env_steps_per_s: _Optional[float] = ..., episodes: _Optional[int] = ..., mean_episode_return: _Optional[float] = ..., policy_lag: _Optional[float] = ..., trainer_steps: _Optional[int] = ..., connected_actors: _Optional[int] = ..., finished: _Optional[bool] = ..., finished_reason: _Optional[str] = ..., uptime_s: _Optional[float] = ..., mean_inference_batch_size: _Optional[float] = ..., eval_policy_version: _Optional[int] = ..., eval_mean_return: _Optional[float] = ..., eval_rounds: _Optional[int] = ..., return_window: _Optional[int] = ..., resent_steps: _Optional[int] = ..., disputed_episodes: _Optional[int] = ..., unvouched_episodes: _Optional[int] = ..., losses: _Optional[_Mapping[str, float]] = ..., eval_metric: _Optional[str] = ..., eval_metric_value: _Optional[float] = ...) -> None: ...

class EvalWorkRequest(_message.Message):
    __slots__ = ("actor_id", "max_episodes")
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODES_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    max_episodes: int
    def __init__(self, actor_id: _Optional[str] = ..., max_episodes: _Optional[int] = ...) -> None: ...

class EvalWork(_message.Message):
    __slots__ = ("round", "policy_version", "episodes", "retry_after_s", "finished")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    round: int
    policy_version: int
    episodes: _containers.RepeatedScalarFieldContainer[int]
    retry_after_s: float
    finished: bool
    def __init__(self, round: _Optional[int] = ..., policy_version: _Optional[int] = ..., episodes: _Optional[_Iterable[int]] = ..., retry_after_s: _Optional[float] = ..., finished: _Optional[bool] = ...) -> None: ...
