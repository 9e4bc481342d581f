"""Markdown tables (tables.md) and the headline JSON (headline.json) from results_smollm2.json and
results_torch_engine.json. Run: python3 make_tables.py (no third-party packages)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
CODECS = ["none", "int8", "int4"]


def fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    if v == 0:
        return "0"
    if abs(v) < 1e-3 or abs(v) >= 1e4:
        return f"{v:.2e}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{digits}f}".rstrip("0").rstrip(".")


def table(run, suffix, with_vs_none):
    head = ("| codec | bytes/value | size vs raw | first-token agreement | bit-exact | max abs logit diff: max / mean / "
            "median | KL(P_full‖P_q): mean / median / max | KV rel. error K / V |")
    lines = [head, "|---" * 8 + "|"]
    for codec in CODECS:
        r = run["results"][f"suffix{suffix}/{codec}/full"]
        agree = f"{r['agreement'] * 100:.1f}% ({r['prompts'] - r['disagreements']}/{r['prompts']})"
        if r.get("disagreements_on_ties"):
            agree += f", {r['disagreements_on_ties']} on exact ties"
        err = (f"{fmt(r['k_rel_err_mean'])} / {fmt(r['v_rel_err_mean'])}" if "k_rel_err_mean" in r else "-")
        lines.append(f"| {codec} | {r['bytes_per_value']:g} | {r['ratio_vs_dtype']:.4f} | {agree} | "
                     f"{r['bit_exact_fraction'] * 100:.0f}% | {fmt(r['max_abs_logit_diff_max'])} / "
                     f"{fmt(r['max_abs_logit_diff_mean'])} / {fmt(r['max_abs_logit_diff_median'])} | "
                     f"{fmt(r['kl_mean'])} / {fmt(r['kl_median'])} / {fmt(r['kl_max'])} | {err} |")
    if with_vs_none:
        lines.append("")
        lines.append("Same codecs measured against the `none` reuse row (isolates the codec from the reuse path's "
                     "kernel-shape noise):")
        lines.append("")
        lines.append("| codec | agreement with none | max abs logit diff: max / mean / median | KL: mean / median / max |")
        lines.append("|---|---|---|---|")
        for codec in ("int8", "int4"):
            r = run["results"][f"suffix{suffix}/{codec}/vs_none"]
            lines.append(f"| {codec} | {r['agreement'] * 100:.1f}% ({r['prompts'] - r['disagreements']}/{r['prompts']}) | "
                         f"{fmt(r['max_abs_logit_diff_max'])} / {fmt(r['max_abs_logit_diff_mean'])} / "
                         f"{fmt(r['max_abs_logit_diff_median'])} | {fmt(r['kl_mean'])} / {fmt(r['kl_median'])} / "
                         f"{fmt(r['kl_max'])} |")
    return "\n".join(lines)


def main():
    out, headline = [], {"codec": "symmetric absmax per (layer, K/V, token, kv_head) group of head_dim values, "
                                  "fp32 scale; int8 q in [-127,127], int4 q in [-7,7]; see kv_codec.py",
                         "metric_reference": "full-precision compute of the same prompt, first generated token",
                         "prefix": "suffix1 = the cached prefix is the prompt minus its last token (headline); suffix16 = "
                                   "minus its last 16 tokens, which the engine computes against the decoded KV",
                         "notes": ["SmolLM2 weights are the Q4_1 GGUF dequantized (not the original bf16 checkpoint)",
                                   "the torch engine has random weights: its first-token distribution is nearly "
                                   "uniform, so its agreement figures say little about a trained model",
                                   "bf16 logits tie exactly in a few prompts; some disagreements are such ties",
                                   "int4 bytes/value includes the fp32 scale: 0.5625 at head_dim 64, not 0.5"],
                         "models": {}}
    for fname, title, vs_none in (("results_smollm2.json", "SmolLM2-135M-Instruct", True),
                                  ("results_torch_engine.json", "cake_torch_engine TorchLlama (random weights)", False)):
        path = os.path.join(HERE, fname)
        if not os.path.exists(path):
            continue
        res = json.load(open(path))
        out.append(f"## {title}\n\n{res['model']}; torch {res['torch']}, {res['threads']} thread(s); "
                   f"{res['prompts']} prompts of {res['prompt_tokens']['min']}-{res['prompt_tokens']['max']} tokens "
                   f"(median {res['prompt_tokens']['median']}).\n")
        hm = headline["models"][title] = {"prompts": res["prompts"], "runs": {}}
        for dname, run in res["runs"].items():
            suffixes = sorted({int(k.split("/")[0][6:]) for k in run["results"]})
            extra = (f", next-token top-1 accuracy on the prompts {run['next_token_top1_on_prompts'] * 100:.1f}%"
                     if "next_token_top1_on_prompts" in run else "")
            for s in suffixes:
                out.append(f"### {title}, {dname} model and KV, cached prefix = prompt minus its last {s} "
                           f"token{'s' if s > 1 else ''}\n\n{run['layers']} layers, {run['kv_heads']} KV heads, head_dim "
                           f"{run['head_dim']}; {run['seconds']:.0f} s for this dtype (all suffixes and codecs){extra}.\n")
                out.append(table(run, s, vs_none) + "\n")
                hm["runs"][f"{dname}/suffix{s}"] = {
                    codec: {k: run["results"][f"suffix{s}/{codec}/full"][k] for k in (
                        "agreement", "disagreements", "bit_exact_fraction", "max_abs_logit_diff_max",
                        "max_abs_logit_diff_mean", "max_abs_logit_diff_median", "kl_mean", "kl_median", "kl_max",
                        "bytes_per_value", "ratio_vs_dtype")} for codec in CODECS}
    sm = headline["models"].get("SmolLM2-135M-Instruct", {}).get("runs", {}).get("bf16/suffix1")
    if sm:
        headline = {"headline (SmolLM2-135M-Instruct, bf16, prefix = prompt minus last token, 240 prompts)": {
            codec: {k: sm[codec][k] for k in ("ratio_vs_dtype", "agreement", "kl_mean", "kl_median", "kl_max",
                                              "max_abs_logit_diff_max", "max_abs_logit_diff_median")}
            for codec in CODECS}, **headline}
    open(os.path.join(HERE, "tables.md"), "w").write("<!-- generated by make_tables.py -->\n\n" + "\n".join(out))
    json.dump(headline, open(os.path.join(HERE, "headline.json"), "w"), indent=1)
    print("\n".join(out))


if __name__ == "__main__":
    main()
