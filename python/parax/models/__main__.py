"""python3 -m parax.models PRESET|config.json|MODEL_DIR [--layers N] [--pad-vocab M] [--batch B --seq S]
                          [--dtype bf16|f32] [--loss [--ignore-index I] [--mtp-weight W [--mtp-depths D]]]
                          [--past P] [--return-kv] [--cache C] [--last-logits]
                          [--mla explicit|absorbed|expanded] [--allow-unknown-config KEY]
                          -o model.mlir"""

import argparse
import sys

from .builder import DTYPES, build_model
from .config import ConfigError, load_config
from .presets import PRESETS


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m parax.models",
        description="Write the parax IR of a model preset or Hugging Face config.json.")
    parser.add_argument("model", nargs="?",
                        help=f"a preset ({', '.join(PRESETS)}) or a config.json path")
    parser.add_argument("--layers", type=int, help="override the number of layers")
    parser.add_argument("--pad-vocab", type=int, metavar="M",
                        help="round the vocabulary up to a multiple of M (Megatron-LM's padding, e.g. 128 x tp: "
                             "GPT-2/3's 50,257 to 51,200 for M = 1024), so that tensor parallelism splits the "
                             "embedding and the output head; a model of that many classes, its checkpoint too")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, help="sequence length (default: min(2048, max positions, a sliding window))")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--loss", action="store_true",
                        help="take labels and return the mean cross-entropy loss")
    parser.add_argument("--ignore-index", type=int,
                        help="with --loss: labels of this value are not counted (Hugging Face's -100)")
    parser.add_argument("--mtp-weight", type=float,
                        help="with --loss: multi-token prediction (DeepSeek-V3), its depths' loss "
                             "weighted this much (0.3, then 0.1 in DeepSeek-V3's training)")
    parser.add_argument("--mtp-depths", type=int,
                        help="with --mtp-weight: this many depths (default: the config's "
                             "num_nextn_predict_layers)")
    parser.add_argument("--past", type=int, default=0,
                        help="a step over a KV cache of P earlier tokens (their keys and "
                             "values are inputs after the tokens; --seq 1: a decode step)")
    parser.add_argument("--return-kv", action="store_true",
                        help="also return each layer's keys and values of these tokens (after "
                             "the logits): the rows the next step's cache gains")
    parser.add_argument("--cache", type=int, default=0,
                        help="one step of a generation loop: --seq tokens at a run-time position "
                             "(an input after the tokens) over per-layer KV caches of capacity C "
                             "(inputs), which the step writes into (parax-run --generate)")
    parser.add_argument("--last-logits", action="store_true",
                        help="logits of the last position only ([batch, 1, vocab]): a prefill "
                             "(--prefill of parax-run --generate) needs no others")
    parser.add_argument("--mla", default="explicit", choices=["explicit", "absorbed", "expanded"],
                        help="DeepSeek-V3's attention: explicit (per-head keys and values), "
                             "weight-absorbed (the KV cache holds the latent; inference), or expanded "
                             "(the same latent cache, each latent expanded per head: a prefill)")
    parser.add_argument("--allow-unknown-config", action="append", default=[], metavar="KEY",
                        help="a config.json field parax does not know, which you vouch leaves the "
                             "model unchanged (unknown fields are refused otherwise); repeatable")
    parser.add_argument("-o", "--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument("--list", action="store_true", help="list the presets")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(PRESETS))
        return 0
    if not args.model:
        parser.error("a preset or config.json is required")
    try:
        cfg = load_config(args.model, layers=args.layers, pad_vocab=args.pad_vocab,
                          allow_unknown=args.allow_unknown_config)
        text = build_model(cfg, batch=args.batch, seq=args.seq, dtype=args.dtype,
                           loss=args.loss, past=args.past, return_kv=args.return_kv,
                           cache=args.cache, last_logits=args.last_logits,
                           mla=args.mla, ignore_index=args.ignore_index,
                           mtp_weight=args.mtp_weight, mtp_depths=args.mtp_depths)
    except (ConfigError, ValueError) as e:
        print(f"parax.models: error: {e}", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
