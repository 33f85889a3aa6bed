"""A Hugging Face vision-language model as a fleetrl agent, after RL4VLM (Zhai et al. 2024).

The model reads a prompt and the observation's image, and writes its chain of thought and
then an action, `{"thoughts": "...", "action": "..."}`. On the learner, `step` is batched
generation for every env of every actor at once (KV cache, sampling with `temperature`
and `top_p`, greedy in eval mode unless `greedy_eval` is off, a stop at EOS). `unroll`, in
training, is one teacher-forced forward pass over prompt plus answer that scores the
answer's tokens again. Both compute a token's log-prob as log softmax(logits / temperature)
over the tokens an answer may hold (special tokens other than EOS are never generated: an
image placeholder in an answer would break the pass that scores it). Top-p only narrows
which token is sampled and is not part of the log-prob, so the ratios of PPO compare like
with like (exactly on-policy with `top_p=1`, the default).

The prompt is a template: `{observation_text}` takes the observation's text (UTF-8 bytes
under `text_key`, with `<text_key>_length`), and the model's chat template wraps it when
the processor has one.

Outputs, per sample ([B, ...] from `step`, [T, B, ...] from `unroll`):
- `token_logprobs` [N], `token_mask` [N] (1 for the answer's tokens, EOS included);
- `baseline`: the value head, a 3-layer MLP on the last layer's hidden state at the end of
  the prompt (the last token before the answer), so acting and training see one state;
  its loss trains the model beneath only with `value_backprop`;
- from `step` only: the answer itself (`tokens`, `num_tokens`, `thought_tokens`, `text`,
  `text_length`; see `fleetrl.envs.text_actions`), and the oracle's answer tokenized the
  same way when the observation carries one (teacher forcing);
- from `unroll` only: `token_entropy` [N].

`thought_tokens` counts the answer's tokens up to the end of its `"action":` marker; the
Problem scales their log-probs by lambda (`fleetrl.problems.vlm`). What trains is chosen
at construction: LoRA adapters (peft) on the language model's projections, or the whole
language model with `lora_rank=0`, plus the vision tower and the projector by flag, and
always the value head. `state_dict` holds exactly those and a fingerprint of the base
model's config, so a checkpoint is small and refuses to load onto another base model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from fleetrl.agents.base import Agent, AgentOutput, Observation, State
from fleetrl.agents.hf.pretrained_base import PretrainedBase, check_model_folder, fingerprint, import_transformers
from fleetrl.agents.vlm.agent_config import VLMAgentConfig
from fleetrl.agents.vlm.generation_record import PromptState, chosen_token_log_probs, final_norm
from fleetrl.agents.vlm.token_offsets import token_byte_lengths, tokens_through
from fleetrl.common.extras import MissingExtra

MARKER = '"action":'
TEXT_SLOT = "{observation_text}"  # where a prompt template takes the observation's text
# Image-text-to-text classes this agent has been run with (tiny ones in the tests).
SUPPORTED = ("LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration",
             "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")


def _transformers():
    return import_transformers("a vision-language agent")


def architecture_of(model_path: str) -> str:
    """The model class a local folder's config.json names."""
    config = _transformers().AutoConfig.from_pretrained(model_path, local_files_only=True)
    return (config.architectures or ["?"])[0]


log = logging.getLogger(__name__)


def load_vlm(model_path: str, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    """The model and processor in the local folder `model_path` (never the hub)."""
    transformers = _transformers()
    check_model_folder(model_path, architecture_of, SUPPORTED, "this agent")
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_path, local_files_only=True, dtype=dtype)
    processor = transformers.AutoProcessor.from_pretrained(model_path, local_files_only=True)
    processor.tokenizer.padding_side = "left"  # generation continues every prompt at the same position
    log.info("loaded %s from %s: %.1fM parameters (%s), its tokenizer and image processor",
             type(model).__name__, model_path, sum(p.numel() for p in model.parameters()) / 1e6, dtype)
    return model, processor


class VLMAgent(PretrainedBase, Agent):
    BASE = "model"

    def __init__(self, config: VLMAgentConfig, prompt: str, image_key: str = "image",
                 text_key: str = "observation_text", oracle_key: str = "oracle_text"):
        """`config`: the agent's settings (a VLM Problem's config is one), checked there; the
        prompt; the observation keys the agent reads."""
        super().__init__()
        c = config
        model_path, dtype = c.model_path, c.dtype
        self.model_path, self.prompt = model_path, prompt
        self.max_new_tokens, self.max_text_bytes = c.max_new_tokens, c.max_text_bytes
        self.temperature, self.top_p = c.temperature, c.top_p
        self.greedy_eval, self.value_backprop = c.greedy_eval, c.value_backprop
        self.image_key, self.text_key, self.oracle_key = image_key, text_key, oracle_key
        model, self.processor = load_vlm(model_path, getattr(torch, dtype))
        self.tokenizer = self.processor.tokenizer
        self._token_bytes = token_byte_lengths(self.tokenizer)  # None: not byte-level BPE
        # Special tokens other than EOS are never generated: an answer holding an image
        # placeholder, say, would break the forward pass that scores it again.
        self.suppressed_tokens = self._special_tokens()
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        if c.lora_rank > 0:
            try:
                import peft
            except ImportError as e:
                raise MissingExtra("LoRA", "vlm", e) from e
            # The language model's projections only: a vision tower may use the same names.
            targets = rf".*language_model.*\.({'|'.join(c.lora_target_modules)})$"
            config = peft.LoraConfig(r=c.lora_rank, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout,
                                     target_modules=targets)
            with warnings.catch_warnings():  # peft 0.21 reads a property that transformers 5 deprecates
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
                model = peft.get_peft_model(model, config)
        else:
            self._unfreeze(model, "language_model")
        if c.train_vision:
            self._unfreeze(model, "vision_tower")
        if c.train_projector:
            self._unfreeze(model, "multi_modal_projector")
        if c.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = model
        width = self._hidden_size(model)
        self.value_head = nn.Sequential(nn.Linear(width, c.value_hidden), nn.Tanh(),
                                        nn.Linear(c.value_hidden, c.value_hidden), nn.Tanh(),
                                        nn.Linear(c.value_hidden, 1))
        self.value_head.to(getattr(torch, dtype))
        self.register_buffer("base_fingerprint", fingerprint(model_path))
        self.remember_what_trains()
        self._generations: list[tuple[float, float, int, float]] = []

    def _special_tokens(self) -> list[int]:
        tokenizer = self.tokenizer
        special = set(tokenizer.all_special_ids)
        special.update(i for i, token in tokenizer.added_tokens_decoder.items() if token.special)
        image = getattr(self.processor, "image_token_id", None) or getattr(tokenizer, "image_token_id", None)
        if image is not None:
            special.add(int(image))
        special.discard(tokenizer.eos_token_id)
        return sorted(i for i in special if i is not None)

    @staticmethod
    def _unfreeze(model: nn.Module, part: str) -> None:
        found = [p for name, p in model.named_parameters() if part in name]
        if not found:
            raise ValueError(f"the model has no parameters named {part!r} to train")
        for parameter in found:
            parameter.requires_grad_(True)

    @staticmethod
    def _hidden_size(model: nn.Module) -> int:
        config = model.config
        text = getattr(config, "text_config", config)
        return int(text.hidden_size)

    # ----- what a checkpoint holds -----

    def export_pretrained(self, directory: str) -> None:
        """Writes the fine-tuned model as a folder that `from_pretrained` loads: the LoRA
        adapters merged into the base weights, with the processor. The value head, which no
        transformers class holds, goes beside them as `value_head.pt`."""
        import copy

        model = copy.deepcopy(self.model)  # merging rewrites the weights: the agent keeps its adapters
        if hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model.save_pretrained(directory)
        self.processor.save_pretrained(directory)
        torch.save(self.value_head.state_dict(), os.path.join(directory, "value_head.pt"))

    # ----- prompts -----

    def _prompts(self, observation: Observation, count: int) -> list[str]:
        """The prompt of each sample: the template with the observation's text (if any) in
        place of {observation_text}, inside the model's chat template when it has one."""
        texts = observation.get(self.text_key)
        if texts is None:
            filled = [self.prompt.replace(TEXT_SLOT, "")] * count
        else:
            lengths = observation[f"{self.text_key}_length"].cpu().tolist()
            filled = [self.prompt.replace(TEXT_SLOT, bytes(row[:int(n)]).decode("utf-8", errors="replace"))
                      for row, n in zip(texts.cpu().numpy(), lengths)]
        template = getattr(self.processor, "chat_template", None)
        if not template:
            return [f"{self.tokenizer.image_token}\n{text}\n" for text in filled]
        return [self.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
            add_generation_prompt=True, tokenize=False) for text in filled]

    def _inputs(self, observation: Observation) -> dict[str, torch.Tensor]:
        """Prompts with the images, left-padded to one length."""
        pictures = list(observation[self.image_key].cpu().numpy())
        inputs = self.processor(images=pictures, text=self._prompts(observation, len(pictures)),
                                return_tensors="pt", padding=True)
        device = self.value_head[0].weight.device
        inputs = {k: v.to(device) for k, v in inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.value_head[0].weight.dtype)
        return inputs

    # ----- acting: batched generation -----

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The policy's log-probs per token from the model's logits: softmax(logits /
        temperature) over the tokens an answer may hold. Acting and training both use it."""
        scaled = logits.float() / self.temperature
        scaled[..., self.suppressed_tokens] = torch.finfo(scaled.dtype).min  # not -inf: 0 * log 0 stays 0
        return torch.log_softmax(scaled, -1)

    def step(self, observation: Observation, first: torch.Tensor, state: State,
             answered: torch.Tensor | None = None) -> tuple[AgentOutput, State]:
        """Generates an answer for each env. `answered` ([B] bool) marks envs whose answer
        comes from elsewhere (the oracle's, in teacher-forced episodes): they get only the
        prompt's value, and an empty answer of log-prob 0."""
        started = time.perf_counter()
        batch = first.shape[0]
        skip = answered.to(torch.bool).cpu() if answered is not None else torch.zeros(batch, dtype=torch.bool)
        generate, prefill = (~skip).nonzero()[:, 0], skip.nonzero()[:, 0]
        parts = []
        if len(generate):
            parts.append((generate, self._generate(_rows(observation, generate))))
        if len(prefill):
            parts.append((prefill, self._prefill(_rows(observation, prefill))))
        out = parts[0][1] if len(parts) == 1 else _merge(parts, batch)
        if self.oracle_key in observation:
            oracle = self._encode_answers(observation[self.oracle_key], observation[f"{self.oracle_key}_length"])
            out.update({f"oracle_{k}": v for k, v in oracle.items()})
        if len(generate):
            self._count({k: out[k][generate.to(out[k].device)] for k in ("num_tokens", "thought_tokens")},
                        time.perf_counter() - started)
        return out, state

    def _generate(self, observation: Observation) -> AgentOutput:
        inputs = self._inputs(observation)
        sample = self.training or not self.greedy_eval
        sampling = dict(do_sample=True, temperature=self.temperature, top_p=self.top_p) if sample \
            else dict(do_sample=False)
        # Generation keeps each chosen token's log-prob and the prompt's state, nothing more
        # (agents/vlm/generation_record.py); a decoder without a final `norm` gets every layer's states.
        scorer, norm = chosen_token_log_probs(self._log_probs), final_norm(self.model)
        with PromptState(norm) if norm is not None else contextlib.nullcontext() as prompt_state:
            generated = self.model.generate(
                **inputs, max_new_tokens=self.max_new_tokens, output_hidden_states=norm is None,
                return_dict_in_generate=True, pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.tokenizer.eos_token_id, suppress_tokens=self.suppressed_tokens,
                logits_processor=self._logits_processors(scorer), **sampling)
        prompt_length = inputs["input_ids"].shape[1]
        tokens = generated.sequences[:, prompt_length:]
        out = self._answer(tokens, scorer.finish(tokens))
        state = prompt_state.state if norm is not None else generated.hidden_states[0][-1][:, -1]
        out["baseline"] = self._value(state)
        return out

    @staticmethod
    def _logits_processors(scorer):
        return import_transformers("VLM generation").LogitsProcessorList([scorer])

    def _prefill(self, observation: Observation) -> AgentOutput:
        """The prompt's value in one forward pass, and an empty answer."""
        hidden = self.model(**self._inputs(observation), output_hidden_states=True).hidden_states[-1][:, -1]
        batch, device = hidden.shape[0], hidden.device
        empty = torch.full((batch, self.max_new_tokens), self.tokenizer.pad_token_id, dtype=torch.long, device=device)
        out = self._describe(empty, torch.zeros(batch, dtype=torch.long, device=device))
        out.update(token_logprobs=torch.zeros(empty.shape, device=device),
                   token_mask=torch.zeros(empty.shape, device=device), baseline=self._value(hidden))
        return out

    def _value(self, prompt_hidden: torch.Tensor) -> torch.Tensor:
        return self.value_head(prompt_hidden.to(self.value_head[0].weight.dtype)).squeeze(-1).float()

    def _answer(self, tokens: torch.Tensor, token_logprobs: torch.Tensor) -> AgentOutput:
        """The generated answers padded to max_new_tokens, cut after EOS, with their text."""
        batch, width = tokens.shape[0], self.max_new_tokens
        padded = torch.full((batch, width), self.tokenizer.pad_token_id, dtype=torch.long, device=tokens.device)
        padded[:, :tokens.shape[1]] = tokens
        logprobs = torch.zeros(batch, width, device=tokens.device)
        logprobs[:, :tokens.shape[1]] = token_logprobs
        is_eos = padded == self.tokenizer.eos_token_id
        first_eos = is_eos.float().argmax(1)
        num_tokens = torch.where(is_eos.any(1), first_eos + 1, torch.full_like(first_eos, tokens.shape[1]))
        mask = (torch.arange(width, device=tokens.device) < num_tokens.unsqueeze(1)).float()
        out = self._describe(padded, num_tokens)
        out.update(token_logprobs=logprobs * mask, token_mask=mask)
        return out

    def _describe(self, tokens: torch.Tensor, num_tokens: torch.Tensor) -> AgentOutput:
        """thought_tokens, and the answers as zero-padded UTF-8 bytes (`text`, `text_length`)."""
        thoughts, texts, lengths = [], [], []
        answers = [row[:count] for row, count in zip(tokens.tolist(), num_tokens.tolist())]  # one host copy
        # The tokenizer's batch decode: one call into the fast tokenizer for the whole batch.
        for answer, text in zip(answers, self.tokenizer.batch_decode(answers, skip_special_tokens=True)):
            thoughts.append(self._thought_tokens(answer, text))
            data = text.encode("utf-8")[:self.max_text_bytes].decode("utf-8", errors="ignore").encode("utf-8")
            texts.append(np.frombuffer(data.ljust(self.max_text_bytes, b"\0"), np.uint8))
            lengths.append(len(data))
        device = tokens.device
        return {"tokens": tokens, "num_tokens": num_tokens,
                "thought_tokens": torch.tensor(thoughts, dtype=torch.long, device=device),
                "text": torch.from_numpy(np.stack(texts)).to(device),
                "text_length": torch.tensor(lengths, dtype=torch.long, device=device)}

    def _thought_tokens(self, answer: list[int], text: str) -> int:
        """How many of the answer's tokens it takes to finish the `"action":` marker (all of
        them when there is none): the smallest k whose decoded prefix holds the marker. The
        byte offsets (`token_offsets`) name k at once; two decodes check it, and a tokenizer
        without them, or a text they do not match, is searched by halves."""
        at = text.lower().find(MARKER)
        if at < 0:
            return len(answer)
        if self._token_bytes is not None:
            k = tokens_through(self._token_bytes, answer, len(text[:at + len(MARKER)].encode("utf-8")))
            if k <= len(answer) and self._holds_marker(answer[:k]) and not self._holds_marker(answer[:k - 1]):
                return k
        low, high = 0, len(answer)
        while low < high:
            middle = (low + high) // 2
            if self._holds_marker(answer[:middle]):
                high = middle
            else:
                low = middle + 1
        return low

    def _holds_marker(self, tokens: list[int]) -> bool:
        return MARKER in self.tokenizer.decode(tokens, skip_special_tokens=True).lower()

    def _encode_answers(self, data: torch.Tensor, lengths: torch.Tensor) -> AgentOutput:
        """Answers given as zero-padded UTF-8 bytes (the oracle's), tokenized as the model
        would write them: tokens, EOS, cut to max_new_tokens."""
        texts = [bytes(row[:int(length)]).decode("utf-8", errors="replace")
                 for row, length in zip(data.cpu().numpy(), lengths.cpu().tolist())]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        rows = [(ids + [self.tokenizer.eos_token_id])[:self.max_new_tokens] for ids in encoded]
        tokens = torch.full((len(rows), self.max_new_tokens), self.tokenizer.pad_token_id, dtype=torch.long)
        for i, ids in enumerate(rows):
            tokens[i, :len(ids)] = torch.tensor(ids)
        tokens = tokens.to(data.device)
        return self._describe(tokens, torch.tensor([len(ids) for ids in rows], device=data.device))

    def _count(self, out: AgentOutput, seconds: float) -> None:
        # One append per batch: atomic, so the summary thread can swap the list out meanwhile.
        self._generations.append((float(out["num_tokens"].sum()), float(out["thought_tokens"].sum()),
                                  len(out["num_tokens"]), seconds))

    def inference_metrics(self) -> dict[str, float]:
        """Generation since the last call: tokens/s, latency per batch, answer lengths."""
        batches, self._generations = self._generations, []
        if not batches:
            return {}
        tokens, thoughts, answers, seconds = (sum(column) for column in zip(*batches))
        return {"generation/tokens_per_s": tokens / max(seconds, 1e-9),
                "generation/latency_ms": 1000 * seconds / len(batches),
                "generation/answer_tokens": tokens / answers,
                "generation/thought_tokens": thoughts / answers}

    # ----- training: one teacher-forced pass over prompt plus answer -----

    def unroll(self, observation: Observation, first: torch.Tensor, state: State,
               actions: dict[str, torch.Tensor] | None = None) -> tuple[AgentOutput, State]:
        if actions is None:
            raise ValueError("VLMAgent.unroll scores answers: pass the actions (the generated tokens)")
        steps, batch = first.shape
        flat = lambda x: x.reshape(steps * batch, *x.shape[2:])  # noqa: E731
        inputs = self._inputs({k: flat(v) for k, v in observation.items()
                               if k in (self.image_key, self.text_key, f"{self.text_key}_length")})
        tokens, num_tokens = flat(actions["tokens"]).long(), flat(actions["num_tokens"]).long()
        width = tokens.shape[1]
        mask = (torch.arange(width, device=tokens.device) < num_tokens.unsqueeze(1))
        prompt_ids, prompt_mask = inputs.pop("input_ids"), inputs.pop("attention_mask")
        prompt_length = prompt_ids.shape[1]
        input_ids = torch.cat([prompt_ids, torch.where(mask, tokens, self.tokenizer.pad_token_id)], 1)
        attention = torch.cat([prompt_mask, mask.long()], 1)
        positions = (attention.cumsum(1) - 1).clamp(min=0)  # as generation counts them with left padding
        result = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                            output_hidden_states=True, **inputs)
        logprobs = self._log_probs(result.logits[:, prompt_length - 1:prompt_length - 1 + width])
        token_logprobs = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) * mask
        entropy = -(logprobs.exp() * logprobs).sum(-1) * mask
        hidden = result.hidden_states[-1][:, prompt_length - 1]
        if not self.value_backprop:
            hidden = hidden.detach()
        value = self.value_head(hidden.to(self.value_head[0].weight.dtype)).squeeze(-1).float()
        out = {"token_logprobs": token_logprobs, "token_entropy": entropy, "token_mask": mask.float(),
               "baseline": value}
        return {k: v.reshape(steps, batch, *v.shape[1:]) for k, v in out.items()}, state


def _rows(observation: Observation, index: torch.Tensor) -> Observation:
    return {k: v[index.to(v.device)] for k, v in observation.items()}


def _merge(parts: list[tuple[torch.Tensor, AgentOutput]], batch: int) -> AgentOutput:
    """The outputs of disjoint row sets, back in row order."""
    merged = {}
    for key, first in parts[0][1].items():
        merged[key] = torch.zeros((batch, *first.shape[1:]), dtype=first.dtype, device=first.device)
        for index, out in parts:
            merged[key][index.to(first.device)] = out[key]
    return merged
