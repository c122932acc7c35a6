"""Build the offline demo model: a tiny Llama-architecture causal LM with a Llama-3 style tokenizer.

A fresh machine has no model to serve and no network to fetch one, so this module makes a complete
Hugging Face checkpoint from nothing: seeded random weights (so tests can compare our serving path
against ``transformers`` generate bit for bit) and a byte-level BPE tokenizer trained on a small
embedded corpus, carrying Llama-3's special tokens and chat format (so the serving code exercises the
same code paths as a real Llama-3 Instruct model). Every file is written deterministically: the same
seed gives byte-identical files on every machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

DEMO_SEED: int = 0

# Model shape: small enough to build and run on two CPU cores in well under a second per step,
# large enough to keep the Llama features that serving code cares about (GQA, RoPE, untied head).
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
MAX_POSITION_EMBEDDINGS = 2048
INIT_STD = 0.02
ROPE_THETA = 500000.0
RMS_NORM_EPS = 1e-5

# BPE vocab size before the special tokens; the embedded corpus supports more merges than this, so
# training always stops here and the special-token ids below are fixed.
BPE_VOCAB_SIZE = 1024

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
START_HEADER_TOKEN = "<|start_header_id|>"
END_HEADER_TOKEN = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"

# Special tokens in Llama-3's order (offsets 0..9 match Llama-3 exactly), appended after the BPE vocab.
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS_TOKEN,
    EOS_TOKEN,
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|reserved_special_token_2|>",
    "<|reserved_special_token_3|>",
    START_HEADER_TOKEN,
    END_HEADER_TOKEN,
    "<|reserved_special_token_4|>",
    EOT_TOKEN,
    *(f"<|reserved_special_token_{i}|>" for i in range(5, 11)),
)

# Llama-3 Instruct format. `bos_token` is rendered into the text, so callers must tokenize the
# result with add_special_tokens=False (as transformers' apply_chat_template(tokenize=True) does).
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{- (message['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

# Training text for the tokenizer. Varied on purpose: prose, code, numbers, accented Latin, CJK and
# emoji, so frequent multi-byte characters get merges while rarer ones still split into byte tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog did not mind; it was a very lazy dog.
Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.
Every morning he went out in his boat, and every evening he came back with fish for the market.
"Will you help me?" she asked. "Of course," he said, "but only if you tell me the whole story."
It is a truth universally acknowledged that a good server must answer every request it accepts.
Serving a language model means loading weights, reading a prompt, and generating one token at a time.
The scheduler batches requests together so that the accelerator is never idle for long.
When a client disconnects, the server should cancel the request and free its memory right away.
Latency is the time to the first token; throughput is the number of tokens produced per second.
We measured 12.5 ms per step at batch size 1, and 48.0 ms per step at batch size 64.
The meeting is on 2024-03-15 at 09:30, room 101. Call +1 (555) 010-9999 or e-mail info@example.com.
Prices: $4.99, $19.95, €3,50 and £12.00; a discount of 15% applies to orders over 100 items.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 64 100 128 256 512 1024 2048 4096 3.14159 2.71828 1e-5.
Version 1.2.3 was released in 2023; version 2.0.0 followed with 7 new features and 31 bug fixes.

def generate(model, prompt: str, max_tokens: int = 16) -> list[int]:
    ids = tokenizer.encode(prompt)
    for _ in range(max_tokens):
        logits = model(ids)[-1]
        next_id = int(logits.argmax())
        if next_id == eos_id:
            break
        ids.append(next_id)
    return ids

class Request:
    def __init__(self, request_id: str, prompt: str, stream: bool = False) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.stream = stream

    def __repr__(self) -> str:
        return f"Request(id={self.request_id!r}, stream={self.stream})"

for (int i = 0; i < n; i++) { sum += values[i] * weights[i]; }
if (x != NULL && x->next == NULL) { return -1; } else { return 0; }
const result = await fetch("/v1/chat/completions", { method: "POST", body: JSON.stringify(data) });
SELECT name, count(*) FROM requests WHERE status = 'done' GROUP BY name ORDER BY 2 DESC;
{"model": "demo", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}
<html><body><p class="note">Hello, world &amp; friends.</p></body></html>
$ python -m pytest tests/unit -q --maxfail=1 && echo "all good"

Le café était plein ; nous avons pris un thé et une crêpe près de la fenêtre.
Il était une fois une élève naïve qui rêvait de voyager à Paris, à Genève et à Québec.
Où est la gare ? Là-bas, à côté de l'hôtel. Ça coûte trois euros, s'il vous plaît.
Viele Grüße aus München! Die Straße ist schön, und die Brötchen schmecken großartig.
Übung macht den Meister. Äpfel und Öl kaufen wir im Laden an der Ecke, gegenüber der Bäckerei.
¿Dónde está la estación? ¡Qué día tan bonito! El niño comió una manzana en el jardín.
A señora disse: não há pão, mas há café e açúcar. Coração, informação, nação, canção.
Dziękuję bardzo. Český jazyk, Ελληνικά, Русский язык: привет, мир! Спасибо, до свидания.
café café café naïve naïve Grüße Grüße résumé résumé déjà vu, über, façade, jalapeño, São Paulo.

中文是世界上使用人数最多的语言之一。我们今天去公园散步，天气很好。
你好，世界！这是一个小模型，用来测试服务器。中文，中文，中国，中国人。
我喜欢学习语言。他们在北京工作，我们在上海生活。今天是星期一。
日本語は面白いです。東京は日本の首都です。こんにちは、世界！ありがとうございます。
日本語を勉強しています。私は毎朝コーヒーを飲みます。日本語、日本語、日本。
한국어는 아름다운 언어입니다. 안녕하세요, 세계! 감사합니다. 한국어, 한국어, 서울.
저는 학생입니다. 오늘 날씨가 좋아요. 우리는 한국어를 공부합니다.

Great job 👍 👍 👍🏽 👍🏽 thanks! 😀 😀 🎉 🎉 ❤️ ❤️ 🚀 🚀 🔥 ✅ ✨
The family 👨‍👩‍👧 👨‍👩‍👧 went on holiday 🏖️ and sent us photos 📷 📷 of the sea 🌊 🌊.
Flags: 🇫🇷 🇩🇪 🇯🇵 🇰🇷 🇫🇷 🇯🇵. Hands: 👋 👋🏻 👋🏿 🙏 🙏. Weather: ☀️ 🌧️ ⛄ ☀️.

Q: What is the capital of France?
A: The capital of France is Paris.
Q: How many days are there in a week?
A: There are seven days in a week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday.
Q: Can you write a short poem?
A: Roses are red, violets are blue, this model is tiny, and so is its view.

In the beginning the tokenizer knew only bytes. Then it learned pairs of bytes, then whole words,
and at last it could read sentences like this one without breaking them into a thousand pieces.
Good tokenizers compress common text well and still handle anything, even text they have never seen.
A short history of the lighthouse keeper. He climbed the stairs at dusk, lit the lamp, and watched the ships.
Some nights the wind was so strong that the windows shook, but the light never went out.
Children from the village would visit him on Sundays and ask about storms, whales, and shipwrecks.
He told them that the sea is patient, that it always gives back what it takes, sooner or later.
Years later, when the lamp was replaced by an automatic one, he still walked up the stairs every evening.

How to make tea: boil fresh water, warm the pot, add one spoon of leaves per cup, and wait four minutes.
Pour slowly. Add milk or lemon if you like, but never both at the same time; that would be strange.
How to make coffee: grind the beans, heat the water to about 94 degrees, and brew for three minutes.

Dear team, thank you for your work this week. The release went smoothly and the users are happy.
Please remember to update the documentation before Friday, and to close any tickets that are done.
If you have questions about the new deployment process, ask in the channel or send me a message.
Best regards, and have a nice weekend!

import json
import os
from pathlib import Path

def load_config(path: Path) -> dict:
    # Read a JSON config file and return it as a dictionary.
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)

def save_config(path: Path, config: dict) -> None:
    path.write_text(json.dumps(config, indent=2, sort_keys=True))

async def stream_tokens(queue, timeout: float = 30.0):
    while True:
        item = await asyncio.wait_for(queue.get(), timeout=timeout)
        if item is None:
            return
        yield item

fn main() { let xs: Vec<i32> = (1..=10).collect(); println!("{:?}", xs.iter().sum::<i32>()); }
func handler(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.URL.Path) }
public static void main(String[] args) { System.out.println("Hello, world!"); }
docker run --rm -p 8000:8000 -v /models:/models server:latest --model-repository=/models
curl -s http://localhost:8000/v2/health/ready && echo ready || echo "not ready"
git commit -m "Fix the tokenizer test" && git push origin main

The table has 3 columns and 4 rows: id, name, score; 1, alice, 0.91; 2, bob, 0.87; 3, carol, 0.95.
Temperature 0.7, top_p 0.9, top_k 40, max_tokens 256, seed 1234, presence_penalty 0.0.
On 1 January 2025 the population was 8,123,456; by 31 December it had grown by 0.8 percent.
Coordinates: 48.8566 N, 2.3522 E. Speed: 299,792,458 m/s. Pi is about 3.14, e is about 2.72.

Weather report: sunny in the morning, cloudy in the afternoon, and light rain in the evening.
Tomorrow will be warmer, with a high of 24 degrees and a low of 15 degrees. Winds from the west.
The train to the airport leaves every twenty minutes from platform four, starting at six o'clock.
Please keep your ticket until the end of the journey; inspectors may check it at any time.

Le matin, nous prenons le petit déjeuner ensemble : du pain, du beurre, de la confiture et du café.
Les enfants vont à l'école à pied. L'après-midi, ils jouent dans le jardin ou lisent des livres.
Guten Morgen! Wie geht es Ihnen? Mir geht es gut, danke. Wir fahren morgen nach Köln und Düsseldorf.
Buenos días. ¿Cómo estás? Muy bien, gracias. Mañana vamos a la playa con mis amigos.

北京和上海都是很大的城市。我们明天去北京，后天去上海。学习中文很有意思。
东京和大阪都是日本的大きな都市です。私は東京に住んでいます。日本語の本を読みます。
서울은 한국의 수도입니다. 우리는 내일 서울에 갑니다. 한국 음식은 맛있어요.

Reactions: 👍 👍 😂 😂 😀 🎉 ❤️ 👍🏽 🙏 — everyone loved it! 👨‍👩‍👧 says hi 👋.
Tabs\tand  double  spaces, trailing spaces   , and new lines
are all part of the text.   Indented lines keep their spaces.
"""


def _special_token_ids() -> dict[str, int]:
    """Ids of the special tokens: appended right after the BPE vocab, as in Llama-3."""
    return {tok: BPE_VOCAB_SIZE + i for i, tok in enumerate(SPECIAL_TOKENS)}


def _build_tokenizer() -> Any:
    """Train the byte-level BPE (deterministic for a fixed corpus) and attach Llama-3 special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    if tokenizer.get_vocab_size() != BPE_VOCAB_SIZE:
        raise RuntimeError(
            f"BPE training gave {tokenizer.get_vocab_size()} tokens, expected {BPE_VOCAB_SIZE}"
        )

    tokenizer.add_special_tokens(
        [AddedToken(tok, special=True, normalized=False, single_word=False) for tok in SPECIAL_TOKENS]
    )
    ids = _special_token_ids()
    for tok, want in ids.items():
        if tokenizer.token_to_id(tok) != want:
            raise RuntimeError(f"special token {tok} got id {tokenizer.token_to_id(tok)}, expected {want}")
    bos_id = ids[BOS_TOKEN]
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tokenizer


def _model_config(vocab_size: int, bos_id: int, eos_id: int) -> dict[str, Any]:
    """config.json, written by hand so the bytes do not depend on the installed transformers version.

    Keeps the classic keys (torch_dtype, rope_theta) that older readers such as checkpoint converters
    expect; current transformers maps them to its newer names on load.
    """
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "head_dim": HIDDEN_SIZE // NUM_HEADS,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": INIT_STD,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": NUM_HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "num_key_value_heads": NUM_KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_scaling": None,
        "rope_theta": ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def _parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every LlamaForCausalLM parameter, spelled out so building skips importing
    transformers (seconds of start-up); the loading tests check these names against the real class."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = config["head_dim"]
    q_dim, kv_dim = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        shapes |= {
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (q_dim, hidden),
            prefix + "self_attn.k_proj.weight": (kv_dim, hidden),
            prefix + "self_attn.v_proj.weight": (kv_dim, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, q_dim),
            prefix + "post_attention_layernorm.weight": (hidden,),
            prefix + "mlp.gate_proj.weight": (inter, hidden),
            prefix + "mlp.up_proj.weight": (inter, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inter),
        }
    return shapes


def _random_weights(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Seeded float32 weights: normal(0, INIT_STD) for matrices, ones for RMSNorm.

    Values come from a private generator seeded with `seed`, drawn in sorted name order, so they
    depend only on the seed: not on transformers' init code or the caller's global RNG state.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    weights: dict[str, Any] = {}
    for name, shape in sorted(_parameter_shapes(config).items()):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, dtype=torch.float32)
        else:
            weights[name] = torch.randn(shape, generator=generator, dtype=torch.float32) * INIT_STD
    return weights


def _dump_json(path: Path, obj: Any) -> None:
    """JSON with stable formatting, so rebuilds are byte-identical."""
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_checkpoint(target: Path, seed: int) -> None:
    """Write every checkpoint file into the (empty) directory `target`."""
    from safetensors.torch import save_file

    tokenizer = _build_tokenizer()
    ids = _special_token_ids()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    config = _model_config(vocab_size, ids[BOS_TOKEN], ids[EOS_TOKEN])

    _dump_json(target / "config.json", config)
    _dump_json(
        target / "generation_config.json",
        {"bos_token_id": ids[BOS_TOKEN], "eos_token_id": [ids[EOS_TOKEN], ids[EOT_TOKEN]]},
    )
    save_file(_random_weights(config, seed), str(target / "model.safetensors"), metadata={"format": "pt"})

    (target / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    added_tokens_decoder = {
        str(ids[tok]): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    _dump_json(
        target / "tokenizer_config.json",
        {
            "added_tokens_decoder": added_tokens_decoder,
            "bos_token": BOS_TOKEN,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": EOT_TOKEN,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": MAX_POSITION_EMBEDDINGS,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    _dump_json(target / "special_tokens_map.json", {"bos_token": BOS_TOKEN, "eos_token": EOT_TOKEN})

    # mkdtemp makes a 0700 dir and safetensors a 0600 file; servers often run as another user.
    target.chmod(0o755)
    for path in target.iterdir():
        path.chmod(0o644)


def _file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, keyed by relative path."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def build_demo_model(out_dir: Path | str, seed: int = DEMO_SEED) -> Path:
    """Write a complete HF checkpoint (weights, config, tokenizer) to `out_dir` and return it.

    Same seed -> byte-identical files. The build happens in a temp dir next to `out_dir` and is renamed
    into place, so an interrupted build never leaves a half-written checkpoint. An existing non-empty
    `out_dir` is accepted only if it holds exactly this build (so concurrent or repeated builds are
    harmless); anything else raises FileExistsError rather than overwriting someone's files.
    """
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_checkpoint(tmp, seed)
        try:
            if out.is_dir() and not any(out.iterdir()):
                out.rmdir()
            os.rename(tmp, out)
            return out
        except OSError:
            # Lost a race, or out_dir already has content: fine only if it is this very build.
            if out.is_dir() and _file_digests(out) == _file_digests(tmp):
                return out
            raise FileExistsError(
                f"{out} exists and does not hold the demo model built with seed {seed}; "
                "remove it or pick another directory"
            ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse that reports bad arguments on a single line (no usage dump), still exiting 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: build the demo model into OUT_DIR and print its path."""
    parser = _OneLineErrorParser(
        prog="python -m trtllm_service.packing.demo_model",
        description="Build the offline demo Llama checkpoint (random weights, Llama-3 style tokenizer).",
    )
    parser.add_argument(
        "out_dir", type=Path, help="directory to create (must be absent, empty, or this build)"
    )
    parser.add_argument("--seed", type=int, default=DEMO_SEED, help=f"weight seed (default {DEMO_SEED})")
    args = parser.parse_args(argv)
    try:
        path = build_demo_model(args.out_dir, seed=args.seed)
    except FileExistsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
