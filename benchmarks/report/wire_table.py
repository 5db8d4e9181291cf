"""Markdown table of benchmarks.wire rows: link bytes per step and per idle second per setting.

    python -m benchmarks.report --wire-table results/wire.jsonl

The link ratio divides a model's dense (``none``) link bytes per step, measured once, by each
row's; the compressor's ratio beside it divides the model's dense gradient bytes (4 per
parameter) by what the compressor counted as sent.
"""

NOTE = ("Link: tx + rx of rank 0's node (kernel counters), per training step, over the timed "
        "steps after warm-up; link ratio: the model's dense (none) link bytes per step over the "
        "row's; compressor ratio: 4 bytes per parameter over what rank 0's compressor counted as "
        "sent; B/value: those counted bytes (payloads, headers, lengths, marker) per value sent; "
        "idle: the same counters while both ranks sleep; step: median of the timing windows.")


def table(rows):
    """The Markdown table of ``rows``, sparse rows in file order, dense rows as references."""
    dense = {r["model"]: r["link_per_step"] for r in rows if r["method"] == "none"}
    lines = ["| setting | model | method | groups | link kB/step | link ratio | counted kB/step (sent) "
             "| compressor ratio | B/value | idle kB/s | step ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        link = r["link_per_step"]
        ratio = f"{dense[r['model']] / link:.1f}x" if r["model"] in dense and r["method"] != "none" else "–"
        counted = r["counted_sent_per_step"]
        own = f"{4 * r['params'] / counted:.0f}x" if counted else "–"
        values = r.get("counted_values_per_step")
        per_value = f"{counted / values:.2f}" if counted and values else "–"
        lines.append(f"| {r['label']} | {r['model']} | {r['method']} | {r.get('num_groups', 0)} "
                     f"| {link / 1e3:.1f} | {ratio} | {counted / 1e3:.1f} | {own} | {per_value} "
                     f"| {r['idle_per_s'] / 1e3:.1f} | {r['step_s'] * 1e3:.1f} |")
    return "\n".join(lines) + "\n\n" + NOTE
