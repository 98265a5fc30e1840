"""Hugging Face generate() with a KV cache, eager vs. dynamo, per decoder family: tokens compared,
native runs counted, time per token.

Each family's model is built from a small config with random weights (transformers, greedy
decoding, `model.forward = dynamo.optimize(model.forward)` on a deep copy), and generate() runs
with the same prompt on both sides: first eager (twice, the second timed), then dynamo three
times (the first records and compiles; the last is timed, as a program that generates again and
again sees it). One row per family:

  PYTHONPATH=python_shim DYNAMO_LIBRARY=build/libdynamo.so.0 .venv/bin/python perf/decode.py \\
      [--families llama,gpt2,...] [--new-tokens 16] [--prompt 12] [--layers 2] [--hidden 128]

Columns: tokens identical to eager's; eager ms per generate; dynamo's first generate (recording
and compiling included) and its last; the last's ratio to eager; native runs of the last
generate / its forward calls; the first fallback reason dynamo.report() gives, if any.
"""
import argparse
import copy
import statistics
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


def _model(family, cfg):
    import transformers as tf
    torch.manual_seed(0)
    auto = tf.AutoModelForSeq2SeqLM if family in ("t5", "bart") else tf.AutoModelForCausalLM
    return auto.from_config(cfg).eval()


def run_family(family, make_cfg, args):
    model = _model(family, make_cfg())
    ids = torch.randint(3, make_cfg().vocab_size, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)

    def gen(m):
        t0 = time.perf_counter()
        out = m.generate(ids, **kw)
        return out, time.perf_counter() - t0

    with torch.no_grad():
        gen(model)
        want, t_eager = min((gen(model) for _ in range(args.repeat)), key=lambda r: r[1])
        mine = copy.deepcopy(model)
        mine.forward = dynamo.optimize(mine.forward)
        got, t_first = gen(mine)
        same = torch.equal(got, want)
        gen(mine)
        before = dynamo.counters()
        got2, t_last = min((gen(mine) for _ in range(args.repeat)), key=lambda r: r[1])
        after = dynamo.counters()
        same = same and torch.equal(got2, want)
    calls = (after["calls"] - before["calls"]) // args.repeat
    native = (after["native_runs"] - before["native_runs"]) // args.repeat
    report = dynamo.report()
    why = next((ln.strip() for ln in report.splitlines() if "fell back" in ln or "not compiled" in ln), "")
    dynamo.reset()
    return dict(family=family, same=same, eager_ms=t_eager * 1e3, first_ms=t_first * 1e3, last_ms=t_last * 1e3,
                native=f"{native}/{calls}", why=why)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="llama,qwen2,mistral,gpt2,opt,gpt_neox,phi3,gemma,t5,bart")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=12)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2, help="timed generate() calls per side (the best is kept)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfgs = _configs(args.layers, args.hidden, args.heads, args.vocab)
    print(f"# generate(): {args.new_tokens} new tokens after {args.prompt}, batch {args.batch}, {args.layers} layers, "
          f"hidden {args.hidden}, {args.heads} heads, vocabulary {args.vocab}, {args.threads} threads")
    print(f"{'family':10} {'tokens':>7} {'eager ms':>9} {'1st ms':>9} {'last ms':>9} {'vs eager':>9} {'native':>8}  why")
    for fam in args.families.split(","):
        if fam not in cfgs:
            sys.exit(f"decode: unknown family {fam!r}; known: {', '.join(cfgs)}")
        try:
            r = run_family(fam, cfgs[fam], args)
        except Exception as e:  # noqa: BLE001 -- a family transformers cannot build here is reported, not fatal
            print(f"{fam:10} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        print(f"{fam:10} {'same' if r['same'] else 'DIFFER':>7} {r['eager_ms']:9.1f} {r['first_ms']:9.1f} "
              f"{r['last_ms']:9.1f} {r['eager_ms'] / r['last_ms']:8.2f}x {r['native']:>8}  {r['why'][:90]}", flush=True)


if __name__ == "__main__":
    main()
