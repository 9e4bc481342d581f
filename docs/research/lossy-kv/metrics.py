"""First-token comparison of two logit vectors, and the summary over prompts."""
import statistics

import torch


def compare(ref, got):
    """ref, got: 1-D logits (any float dtype) of the first generated token. KL(P_ref || P_got) in fp64."""
    ref = ref.double()
    got = got.double()
    lp, lq = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
    kl = float((lp.exp() * (lp - lq)).sum().clamp_min(0.0))
    top2 = torch.topk(ref, 2).values
    return {
        "agree": int(ref.argmax() == got.argmax()),
        "max_abs": float((ref - got).abs().max()),
        "kl": kl,
        "bit_exact": int(torch.equal(ref, got)),
        "ref_margin": float(top2[0] - top2[1]),   # top-1 minus top-2 logit of the reference
    }


def rel_err(x, y):
    """||y - x|| / ||x|| in fp64 (the KV's relative RMS error)."""
    x, y = x.double(), y.double()
    return float((y - x).norm() / x.norm().clamp_min(1e-300))


def summarize(rows):
    """rows: the compare() dicts of one (model, dtype, suffix, codec) over all prompts."""
    n = len(rows)
    mx = [r["max_abs"] for r in rows]
    kl = [r["kl"] for r in rows]
    flips = [r["ref_margin"] for r in rows if not r["agree"]]
    out = {
        "prompts": n,
        "agreement": sum(r["agree"] for r in rows) / n,
        "disagreements": n - sum(r["agree"] for r in rows),
        "bit_exact_fraction": sum(r["bit_exact"] for r in rows) / n,
        "max_abs_logit_diff_max": max(mx),
        "max_abs_logit_diff_mean": statistics.fmean(mx),
        "max_abs_logit_diff_median": statistics.median(mx),
        "kl_mean": statistics.fmean(kl),
        "kl_median": statistics.median(kl),
        "kl_max": max(kl),
        "ref_margin_of_disagreements_max": max(flips) if flips else None,
        # bf16/fp16 logits are coarse: the reference's top two can tie exactly, and then either answer is "right"
        "reference_ties": sum(r["ref_margin"] == 0 for r in rows),
        "disagreements_on_ties": sum(1 for m in flips if m == 0),
    }
    for key in ("k_rel_err", "v_rel_err"):
        vals = [r[key] for r in rows if key in r]
        if vals:
            out[key + "_mean"] = statistics.fmean(vals)
    return out
