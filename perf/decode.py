"""Hugging Face generate() with a KV cache, eager vs. torch.compile vs. dynamo, per decoder family:
tokens compared, native runs counted, prefill and decode timed, decode held against the memory
bandwidth.

Each family's model is built from a small config with random weights (transformers, greedy
decoding, `model.forward = dynamo.optimize(model.forward)` -- or `torch.compile(model.forward)`;
the `eager-static`, `static` and `dynamo-static` sides with `cache_implementation="static"`
(transformers' StaticCache, the setting its docs give torch.compile: cache tensors of a fixed
length written in place, so every decode step has the same shapes) -- on a deep copy), and
generate() runs with the same prompt on every side: eager first (its tokens are the reference),
then each other side: a first generate() (recording and compiling included, the "1st ms"
column), one more, then the timed ones (as a program that generates again
and again sees it). One row per family and side:

  PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/decode.py \\
      [--families llama,gpt2,...] [--sides eager,compile,dynamo] [--new-tokens 16] [--prompt 12] \\
      [--layers 2] [--hidden 128] [--batch 1] [--dtype bfloat16]

Columns: tokens identical to eager's (with --dtype bfloat16: `=n/N` or `~n/N`, the same tokens
as eager's bf16 or others, and n: how many lead as the float32 model's do -- bf16 rounding parts
bf16 from float32 after some tokens on random weights, eager's own bf16 as much); the first generate() (ms); a whole generate() of N tokens;
its prefill (a generate() of one token); a decode step ((whole - prefill) / (N - 1)); the decode
step's speed vs eager's; the decode step's bytes (every weight once and the key/value cache at the
middle length) per its time, as a share of the measured triad bandwidth (the roofline); a decode
step's forward call alone (the median one of a generate(): the step without generate()'s own
Python, ~1.5 ms per token here) and its share of the roofline; native
runs / forward calls of a timed generate(); the first fallback dynamo.report() gives, if any.
"""
import argparse
import copy
import functools
import sys
import time

import torch

import dynamo


def _configs(layers, hidden, heads, vocab):
    import transformers as tf
    inter = hidden * 2
    kv = max(1, heads // 2)
    return {
        "llama": lambda: tf.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv),
        "qwen2": lambda: tf.Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv),
        "mistral": lambda: tf.MistralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                            num_hidden_layers=layers, num_attention_heads=heads,
                                            num_key_value_heads=kv),
        "gpt2": lambda: tf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads),
        "opt": lambda: tf.OPTConfig(vocab_size=vocab, hidden_size=hidden, ffn_dim=inter, num_hidden_layers=layers,
                                    num_attention_heads=heads, word_embed_proj_dim=hidden),
        "gpt_neox": lambda: tf.GPTNeoXConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                             num_hidden_layers=layers, num_attention_heads=heads),
        "phi3": lambda: tf.Phi3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                      pad_token_id=0),
        "gemma": lambda: tf.GemmaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                                        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                        head_dim=hidden // heads),
        "t5": lambda: tf.T5Config(vocab_size=vocab, d_model=hidden, d_ff=inter, num_layers=layers,
                                  num_decoder_layers=layers, num_heads=heads, d_kv=hidden // heads,
                                  decoder_start_token_id=0),
        "bart": lambda: tf.BartConfig(vocab_size=vocab, d_model=hidden, encoder_layers=layers, decoder_layers=layers,
                                      encoder_attention_heads=heads, decoder_attention_heads=heads,
                                      encoder_ffn_dim=inter, decoder_ffn_dim=inter),
    }


def _model(family, cfg, dtype):
    import transformers as tf
    torch.manual_seed(0)
    auto = tf.AutoModelForSeq2SeqLM if family in ("t5", "bart") else tf.AutoModelForCausalLM
    return auto.from_config(cfg).eval().to(dtype)


def triad_gbs():
    """Memory bandwidth measured as a STREAM triad (a = b + s * c over 3 x 64 MB float32, the best
    of 5), in GB/s of bytes moved: the roofline a decode step's bytes are held against."""
    n = 16 * 1024 * 1024
    b, c, a = torch.rand(n), torch.rand(n), torch.empty(n)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=1.5, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * 4 * n / best / 1e9


def step_bytes(model, batch, length):
    """Bytes a decode step reads at least: every weight once (the output projection included,
    tied or not; the decoder's alone in an encoder-decoder model) but the embedding tables it
    reads a row of, and the key/value cache of `length` positions in each layer."""
    out_w = model.get_output_embeddings().weight.data_ptr()
    rows = {m.weight.data_ptr() for m in model.modules() if isinstance(m, torch.nn.Embedding)} - {out_w}
    seen, total = set(), 0
    # (an encoder-decoder model's decode step runs the decoder and the output projection only)
    params = list(model.parameters()) if not model.config.is_encoder_decoder else \
        list(model.get_decoder().parameters()) + [model.get_output_embeddings().weight]
    for p in params:
        if p.data_ptr() not in seen and p.data_ptr() not in rows:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    cfg = model.config
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_decoder_layers", None) or cfg.num_layers
    heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None) or cfg.num_heads
    hidden = getattr(cfg, "hidden_size", None) or cfg.d_model
    head_dim = getattr(cfg, "head_dim", None) or hidden // (getattr(cfg, "num_attention_heads", None) or cfg.num_heads)
    elem = next(model.parameters()).element_size()
    return total + 2 * layers * batch * length * heads * head_dim * elem


def _agree(tokens, ref, n):
    """How many of the n generated tokens lead alike in tokens and ref (every row); None
    without ref."""
    if ref is None:
        return None
    same = (tokens[:, -n:] == ref[:, -n:]).all(0)
    return int(same.long().cumprod(0).sum()) if same.numel() else 0


def run_family(family, make_cfg, args):
    dtype = getattr(torch, args.dtype)
    model = _model(family, make_cfg(), dtype)
    ids = torch.randint(3, make_cfg().vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    kw = dict(do_sample=False, pad_token_id=0)
    extra = {}  # the side's own generate() arguments (static: cache_implementation="static")

    def gen(m, n):
        t0 = time.perf_counter()
        out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw, **extra)
        return out, time.perf_counter() - t0

    def timed(m):
        """(tokens, ms of a whole generate(), ms of its prefill, ms per decode step): the best of
        args.repeat; the prefill is generate() of one token, a decode step the rest over N - 1."""
        out, whole = min((gen(m, args.new_tokens) for _ in range(args.repeat)), key=lambda r: r[1])
        prefill = min(gen(m, 1)[1] for _ in range(args.repeat))
        return out, whole * 1e3, prefill * 1e3, (whole - prefill) * 1e3 / max(args.new_tokens - 1, 1)

    def forward_ms(m):
        """ms of a decode step's forward call alone (the median over a generate() of N tokens, its
        prefill call left out): the model's share of a step, without generate()'s own Python."""
        inner, spent = m.forward, []

        @functools.wraps(inner)
        def timing(*a, **k):
            t0 = time.perf_counter()
            r = inner(*a, **k)
            spent.append(time.perf_counter() - t0)
            return r

        had = "forward" in m.__dict__
        m.forward = timing
        try:
            gen(m, args.new_tokens)
        finally:
            if had:
                m.forward = inner
            else:
                del m.forward
        decode = sorted(spent[1:])
        return decode[len(decode) // 2] * 1e3 if decode else 0.0

    rows = {}
    with torch.no_grad():
        gen(model, args.new_tokens)
        want, *times = timed(model)
        ref32 = None  # a bf16 model's tokens are held against its float32 twin's too
        if dtype != torch.float32:
            ref32 = gen(_model(family, make_cfg(), torch.float32), args.new_tokens)[0]
        rows["eager"] = dict(same=True, first=None, times=times + [forward_ms(model)], native="",
                             fp32=_agree(want, ref32, args.new_tokens))
        for side in args.sides.split(","):
            if side == "eager":
                continue
            mine = copy.deepcopy(model)
            extra.clear()
            if side in ("dynamo", "dynamo-static"):
                mine.forward = dynamo.optimize(mine.forward)
                if side == "dynamo-static":
                    extra["cache_implementation"] = "static"
            elif side == "eager-static":
                extra["cache_implementation"] = "static"
            elif side in ("compile", "static"):
                mine.forward = torch.compile(mine.forward)
                if side == "static":  # (transformers' StaticCache: fixed-size cache tensors written in place)
                    extra["cache_implementation"] = "static"
            else:
                sys.exit(f"decode: unknown side {side!r} (eager, eager-static, compile, static, dynamo, dynamo-static)")
            before = dynamo.counters()
            try:
                got, t_first = gen(mine, args.new_tokens)
            except Exception as e:  # noqa: BLE001 -- a family without a StaticCache here is reported in its row
                if "cache_implementation" not in extra:
                    raise
                rows[side] = dict(skipped=f"{type(e).__name__}: {str(e)[:60]}")
                continue
            after = dynamo.counters()
            gen(mine, args.new_tokens)
            before = dynamo.counters()
            got2, *times = timed(mine)
            after = dynamo.counters()
            times.append(forward_ms(mine))
            calls, native = after["calls"] - before["calls"], after["native_runs"] - before["native_runs"]
            report = dynamo.report() if side.startswith("dynamo") else ""
            why = next((ln.strip() for ln in report.splitlines() if "fell back" in ln or "not compiled" in ln), "")
            rows[side] = dict(same=torch.equal(got, want) and torch.equal(got2, want), first=t_first * 1e3,
                              times=times, native=f"{native}/{calls}" if side.startswith("dynamo") else "", why=why,
                              fp32=None if ref32 is None else min(_agree(got, ref32, args.new_tokens),
                                                                    _agree(got2, ref32, args.new_tokens)))
            dynamo.reset()
            torch._dynamo.reset()
        extra.clear()
    length = args.prompt + args.new_tokens // 2
    return rows, step_bytes(model, args.batch, length)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="llama,qwen2,mistral,gpt2,opt,gpt_neox,phi3,gemma,t5,bart")
    ap.add_argument("--sides", default="eager,dynamo",
                    help="eager, eager-static (eager with transformers' StaticCache), compile (torch.compile), static "
                         "(torch.compile with the StaticCache), dynamo, dynamo-static (dynamo with the StaticCache)")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 (the model's weights)")
    ap.add_argument("--repeat", type=int, default=2, help="timed generate() calls per side (the best is kept)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfgs = _configs(args.layers, args.hidden, args.heads, args.vocab)
    bw = triad_gbs()
    print(f"# generate(): {args.new_tokens} new tokens after {args.prompt}, batch {args.batch}, {args.layers} layers, "
          f"hidden {args.hidden}, {args.heads} heads, vocabulary {args.vocab}, {args.dtype}, {args.threads} threads; "
          f"triad bandwidth {bw:.1f} GB/s")
    print(f"{'family':10} {'side':13} {'tokens':>7} {'1st ms':>8} {'gen ms':>8} {'prefill':>8} {'ms/token':>9} "
          f"{'vs eager':>9} {'roofline':>9} {'fwd ms':>7} {'fwd roof':>9} {'native':>8}  why")
    for fam in args.families.split(","):
        if fam not in cfgs:
            sys.exit(f"decode: unknown family {fam!r}; known: {', '.join(cfgs)}")
        try:
            rows, nbytes = run_family(fam, cfgs[fam], args)
        except Exception as e:  # noqa: BLE001 -- a family transformers cannot build here is reported, not fatal
            print(f"{fam:10} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        base = rows["eager"]["times"][2]
        for side, r in rows.items():
            if "skipped" in r:
                print(f"{fam:10} {side:13} {'n/a':>7}  {r['skipped']}", flush=True)
                continue
            whole, prefill, per_token, fwd = r["times"]
            first = f"{r['first']:8.1f}" if r["first"] is not None else f"{'':8}"
            roof = nbytes / (per_token / 1e3) / 1e9 / bw * 100 if per_token > 0 else 0.0
            roof_fwd = nbytes / (fwd / 1e3) / 1e9 / bw * 100 if fwd > 0 else 0.0
            same = "same" if r["same"] else "DIFFER"
            if r["fp32"] is not None:  # (bf16: how many tokens lead as the float32 model's)
                same = f"{'=' if r['same'] else '~'}{r['fp32']}/{args.new_tokens}"
            print(f"{fam:10} {side:13} {same:>7} {first} {whole:8.1f} {prefill:8.1f} "
                  f"{per_token:9.2f} {base / per_token:8.2f}x {roof:8.0f}% {fwd:7.2f} {roof_fwd:8.0f}% {r['native']:>8}  "
                  f"{r.get('why', '')[:70]}",
                  flush=True)


if __name__ == "__main__":
    main()
