"""pi0 / pi0.5 checkpoint folders: openpi's PyTorch layout, LeRobot's and RLinf's, read and written.

What loads (`load_pi0`):
- openpi: `model.safetensors` (openpi's key names), `config.json` (its variant names:
  paligemma_variant, action_expert_variant, action_dim, action_horizon, precision) and
  `assets/<asset_id>/norm_stats.json`;
- LeRobot: the same keys under a `model.` prefix, its config.json (chunk_size,
  max_action_dim, tokenizer_max_length and the variant names);
- RLinf: every `*.safetensors` of the folder, `<asset_id>/norm_stats.json` (no assets/);
- fleetrl's own export, and the conformance fixture: config.json with explicit sizes
  ("paligemma", "action_expert", "vision" blocks) for models of no named variant.
JAX/orbax checkpoints do not load: openpi's converter writes the PyTorch folder first.

pi0 or pi0.5 is read from the weights (pi0.5's expert norms are adaptive), not the config.
A real file stores the tied PaliGemma embedding once, as its lm_head: it is taken from
there. The expert's lm_head (unused by the model) is never read. The model is built on
the meta device and each tensor goes from the file straight into its dtype, so loading
takes about the file's size in memory, not a float32 copy on the way. In bfloat16,
openpi's float32 islands stay float32: every norm, the SigLIP patch and position
embeddings, and the small projections around the expert.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import torch

from fleetrl.agents.pi0.model import GEMMA_VARIANTS, GemmaSize, Pi0Config, Pi0Model, SiglipSize
from fleetrl.common.extras import MissingExtra

WEIGHTS = "model.safetensors"
EMBEDDING = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
LM_HEAD = "paligemma_with_expert.paligemma.lm_head.weight"
EXPERT_LM_HEAD = "paligemma_with_expert.gemma_expert.lm_head.weight"
LEROBOT_PREFIX = "model."
ADAPTIVE_KEY = "paligemma_with_expert.gemma_expert.model.norm.dense.weight"
# Modules openpi keeps float32 in a bfloat16 model: Gemma's norms (pi0.5's adaptive ones too),
# SigLIP's patch and position embeddings, and the small projections around the expert.
FLOAT32_MODULES = frozenset({"input_layernorm", "post_attention_layernorm", "norm", "patch_embedding",
                             "position_embedding", "state_proj", "action_in_proj", "action_out_proj",
                             "action_time_mlp_in", "action_time_mlp_out", "time_mlp_in", "time_mlp_out"})
DEFAULT_TOKENS = {False: 48, True: 200}  # pi0, pi0.5


def keeps_float32(name: str) -> bool:
    """True for a parameter that openpi keeps float32 in a bfloat16 model."""
    return any(part in FLOAT32_MODULES for part in name.split("."))


def weight_files(model_path: str) -> list[str]:
    if not os.path.isdir(model_path):
        raise ValueError(f"--model_path={model_path}: no such folder (a pi0 checkpoint folder holds {WEIGHTS}; "
                         "nothing is downloaded)")
    files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    if not files:
        raise ValueError(f"--model_path={model_path} holds no *.safetensors. A JAX (orbax) checkpoint must first "
                         "be converted to openpi's PyTorch layout (openpi's convert_jax_model_to_pytorch.py)")
    return files


@dataclasses.dataclass
class StoredTensor:
    file: str
    name: str  # its name in the file
    shape: tuple[int, ...]


def stored_tensors(files: list[str]) -> dict[str, StoredTensor]:
    """openpi's key -> where it is stored; LeRobot's `model.` prefix removed."""
    try:
        from safetensors import safe_open
    except ImportError as e:  # reached without transformers when a tiny model was built before, say
        raise MissingExtra("a pi0 checkpoint", "vlm", e) from e

    stored = {}
    for path in files:
        with safe_open(path, "pt") as f:
            for name in f.keys():
                key = name[len(LEROBOT_PREFIX):] if name.startswith(LEROBOT_PREFIX) else name
                stored[key] = StoredTensor(path, name, tuple(f.get_slice(name).get_shape()))
    if EMBEDDING not in stored and LM_HEAD in stored:  # tied: a real file keeps the lm_head's name only
        stored[EMBEDDING] = stored[LM_HEAD]
    stored.pop(LM_HEAD, None)
    stored.pop(EXPERT_LM_HEAD, None)  # 257k x 1024 the model never uses: not read
    return stored


def _gemma(block: dict) -> GemmaSize:
    fields = {f.name for f in dataclasses.fields(GemmaSize)}
    return GemmaSize(**{k: v for k, v in block.items() if k in fields})


def _variant(name: str, what: str) -> GemmaSize:
    if name not in GEMMA_VARIANTS:
        raise ValueError(f"config.json: unknown {what} {name!r}; known: {', '.join(GEMMA_VARIANTS)} (or give "
                         "explicit sizes)")
    return GEMMA_VARIANTS[name]


def read_config(model_path: str, stored: dict[str, StoredTensor], max_token_len: int = 0,
                discrete_state_input: bool | None = None) -> Pi0Config:
    """The model's config from the folder's config.json (openpi's, LeRobot's or explicit
    sizes) and the weights (the variant, the vocabulary)."""
    path = os.path.join(model_path, "config.json")
    raw = {}
    if os.path.isfile(path):
        with open(path) as f:
            raw = json.load(f)
    pi05 = ADAPTIVE_KEY in stored
    if "paligemma" in raw and isinstance(raw["paligemma"], dict):
        paligemma, expert = _gemma(raw["paligemma"]), _gemma(raw["action_expert"])
    else:
        paligemma = _variant(raw.get("paligemma_variant", "gemma_2b"), "paligemma_variant")
        expert = _variant(raw.get("action_expert_variant", "gemma_300m"), "action_expert_variant")
    if EMBEDDING in stored:
        paligemma = dataclasses.replace(paligemma, vocab_size=stored[EMBEDDING].shape[0])
    vision = SiglipSize()
    if isinstance(raw.get("vision"), dict):
        v = raw["vision"]
        vision = SiglipSize(v["hidden_size"], v["num_hidden_layers"], v["intermediate_size"],
                            v["num_attention_heads"], v["image_size"], v["patch_size"], v.get("layer_norm_eps", 1e-6))
    return Pi0Config(
        pi05=pi05, paligemma=paligemma, expert=expert, vision=vision,
        action_dim=int(raw.get("action_dim", raw.get("max_action_dim", 32))),
        action_horizon=int(raw.get("action_horizon", raw.get("chunk_size", 50))),
        max_token_len=max_token_len or int(raw.get("max_token_len", raw.get("tokenizer_max_length",
                                                                             DEFAULT_TOKENS[pi05]))),
        discrete_state_input=bool(raw.get("discrete_state_input", False)) if discrete_state_input is None
        else discrete_state_input)


def load_pi0(model_path: str, dtype: str = "float32", device: str | torch.device = "cpu", max_token_len: int = 0,
             discrete_state_input: bool | None = None) -> Pi0Model:
    """The pi0 or pi0.5 in the folder `model_path`, in eval mode. Wrong keys or shapes are
    refused with their names."""
    stored = stored_tensors(weight_files(model_path))
    config = read_config(model_path, stored, max_token_len, discrete_state_input)
    with torch.device("meta"):
        model = Pi0Model(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    wrong = [f"{k}: {stored[k].shape} in the file, {expected[k]} in a {_name(config)}" for k in sorted(expected)
             if k in stored and stored[k].shape != expected[k]]
    if missing or unexpected or wrong:
        raise ValueError(f"{model_path} does not hold a {_name(config)} as its config.json describes: "
                         + "; ".join(f"{what} ({len(keys)}): {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                                     for what, keys in (("missing", missing), ("unexpected", unexpected),
                                                        ("wrong shapes", wrong)) if keys))
    target = getattr(torch, dtype)
    weights = {}
    from safetensors import safe_open

    for path in sorted({t.file for t in stored.values()}):
        with safe_open(path, "pt", device="cpu") as f:
            for key, tensor in stored.items():
                if tensor.file == path:
                    wanted = torch.float32 if keeps_float32(key) else target
                    weights[key] = f.get_tensor(tensor.name).to(device=device, dtype=wanted)
    model.load_state_dict(weights, assign=True)
    _restore_buffers(model, device)
    return model.eval()


def _restore_buffers(model: Pi0Model, device: str | torch.device) -> None:
    """Buffers that no file holds were built on the meta device: made again where the weights are."""
    embeddings = model.paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings
    embeddings.position_ids = torch.arange(embeddings.num_positions, device=device).expand((1, -1))


def _name(config: Pi0Config) -> str:
    return "pi0.5" if config.pi05 else "pi0"


def _variant_name(size: GemmaSize) -> str:
    return next((name for name, known in GEMMA_VARIANTS.items()
                 if dataclasses.replace(known, vocab_size=size.vocab_size) == size), "custom")


def save_pi0(model: Pi0Model, folder: str, dtype: str | None = None) -> None:
    """`model.safetensors` with openpi's keys (the embedding stored as the lm_head, and the
    expert's lm_head as zeros, as a file from openpi holds them) and config.json with
    openpi's fields plus the explicit sizes."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    c = model.config
    weights = {}
    for key, tensor in model.state_dict().items():
        if dtype is not None and tensor.is_floating_point() and not keeps_float32(key):
            tensor = tensor.to(getattr(torch, dtype))
        weights[LM_HEAD if key == EMBEDDING else key] = tensor.detach().contiguous().cpu()
    weights[EXPERT_LM_HEAD] = torch.zeros(c.paligemma.vocab_size, c.expert.width, dtype=weights[LM_HEAD].dtype)
    save_file(weights, os.path.join(folder, WEIGHTS), metadata={"format": "pt"})
    config = {
        "action_dim": c.action_dim, "action_horizon": c.action_horizon,
        "paligemma_variant": _variant_name(c.paligemma), "action_expert_variant": _variant_name(c.expert),
        "precision": dtype or str(weights[LM_HEAD].dtype).removeprefix("torch."),
        "pi05": c.pi05, "max_token_len": c.max_token_len, "discrete_state_input": c.discrete_state_input,
        "paligemma": dataclasses.asdict(c.paligemma), "action_expert": dataclasses.asdict(c.expert),
        "vision": {"hidden_size": c.vision.width, "num_hidden_layers": c.vision.depth,
                   "intermediate_size": c.vision.mlp_dim, "num_attention_heads": c.vision.num_heads,
                   "image_size": c.vision.image_size, "patch_size": c.vision.patch_size,
                   "layer_norm_eps": c.vision.layer_norm_eps},
    }
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
