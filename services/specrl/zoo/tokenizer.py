"""A character-level HF tokenizer for the zoo models.

Character level keeps the tiny models honest (no hub tokenizer to download) and makes the
vocabulary small enough that exact next-token distributions can be enumerated in tests.
It is saved as a standard `tokenizer.json` + `tokenizer_config.json`, so vLLM and
transformers load it like any other fast tokenizer.
"""

from __future__ import annotations

from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<|unk|>"
# A chat template of the ChatML kind Qwen3 uses, so that the chat path (data.chat, rows of
# messages, the end-of-turn stop token) runs for real on the zoo; `enable_thinking: false`
# opens the answer with an empty reasoning block, as Qwen3's template does.
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
VOCAB_SIZE = 128  # model vocab; the tokenizer fills it with reserved tokens

_CHARS = ["\n", *[chr(c) for c in range(32, 127)]]


def vocabulary() -> dict[str, int]:
    """Token -> id for every id in [0, VOCAB_SIZE)."""
    tokens = [EOS_TOKEN, UNK_TOKEN, *_CHARS, TURN_START, TURN_END]
    tokens += [f"<|reserved_{i}|>" for i in range(VOCAB_SIZE - len(tokens))]
    return {t: i for i, t in enumerate(tokens)}


def build(out_dir: Path) -> None:
    """Write the tokenizer files into out_dir (a model directory)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    special = [t for t in vocab if t.startswith("<|")]
    tok.add_special_tokens(special)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(str(out_dir))
