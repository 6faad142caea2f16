"""The report of ``ductwork verify --report DIR``: ``report.json``, one ``report.html`` and
the pictures as PNG files beside it.

    >>> paths = write_report(result, Path("audit"), histories)
    >>> paths["report.html"]                 # what an auditor opens

The page is self-contained (inline style, pictures as ``data:`` URIs, no script, nothing
fetched): it is attached to an audit and opened offline, years later, and still looks
the same. Every value that comes from data (settings read from the server, the URL,
pipeline and key names, findings quoting payloads) is HTML-escaped: a report must not
run what it reports.

The pictures are drawn only when matplotlib imports (the ``verify`` extra); without it
the page says so and nothing fails. They are drawn with ``Figure`` and the Agg canvas
directly, so writing a report never changes the caller's matplotlib backend. Their
series are pure functions of a :class:`~ductwork_proof.history.History` that count as
the checkers do (:mod:`ductwork_proof.checkers`), so a picture never shows a limit
crossed that INV-LIM-1 or INV-LIM-2 passed, nor the reverse.
"""

from __future__ import annotations

import base64
import bisect
import html
import io
import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from ductwork.limit_entries import US_PER_S, RateEntry
from ductwork_proof.history import Execution, History
from ductwork_proof.invariants import STATEMENTS
from ductwork_proof.results import Check, VerifyResult

#: What no run of ``ductwork verify`` checks, printed when the orchestrator gave no list.
NOT_CHECKED_DEFAULT = (
    "power loss and torn writes",
    "replicas and failover",
    "clock skew between database servers",
    "other isolation settings than the one read",
    "workloads other than the ones run",
)
NO_MATPLOTLIB = "pictures need the verify extra (matplotlib): pip install 'ductwork[verify]'"


# --------------------------------------------------------------------------- series


def _claimed(history: History, key: str) -> list[tuple[int, Execution]]:
    """(claim time, execution) of the key's claimed executions, in history order."""
    return [(e.claimed_at_us, e) for e in history.executions if e.key == key and e.claimed_at_us is not None]


def _claim_times(history: History, key: str) -> list[int]:
    """The key's claim times in the order INV-LIM-2's window bound reads them."""
    ordered = sorted(_claimed(history, key), key=lambda c: (c[0], c[1].claim_seq or 0, c[1].execution_id))
    return [t for t, _ in ordered]


def history_span(history: History) -> tuple[int, int] | None:
    """(first claim, last recorded time) in µs; None for a history without claims.

    The end is the latest time any record of the round carries: an execution still open
    then was in flight until it, as far as the history knows.
    """
    claims = [e.claimed_at_us for e in history.executions if e.claimed_at_us is not None]
    if not claims:
        return None
    times = [*claims, *(e.completed_at_us for e in history.executions),
             *(r.completed_at_us for r in history.runs), *(r.halted_at_us for r in history.runs),
             *(s.completed_at_us for s in history.steps), *(w.ended_at_us for w in history.witnesses),
             *(w.started_at_us for w in history.witnesses)]
    return min(claims), max(t for t in times if t is not None)


def inflight_series(history: History, key: str) -> list[tuple[int, int]]:
    """(time µs, executions of ``key`` in flight from then on), one point per claim and
    release, then one at the history's end: a step function (``where="post"``).

    Counted as INV-LIM-1 counts: when every claim has a ``claim_seq``, events go in the
    key's sequence order (a release without ``release_seq`` never happened, as the
    checker reads it), each placed at its recorded time but never before the event
    sequenced ahead of it (two transactions' clocks may read out of their lock order).
    Otherwise by time, a release before a claim at the same microsecond. An execution
    without a completion counts until the history's end.
    """
    claims = _claimed(history, key)
    events: list[tuple[int, int, int, str]] = []  # (order, +1 claim | -1 release, time, id)
    sequenced = [(seq, t, e) for t, e in claims if (seq := e.claim_seq) is not None]
    if len(sequenced) == len(claims):
        for seq, t, e in sequenced:
            events.append((seq, +1, t, e.execution_id))
            if e.release_seq is not None and e.completed_at_us is not None:
                events.append((e.release_seq, -1, e.completed_at_us, e.execution_id))
        events.sort(key=lambda ev: (ev[0], -ev[1], ev[3]))
    else:
        for t, e in claims:
            events.append((t, +1, t, e.execution_id))
            if e.completed_at_us is not None:
                events.append((e.completed_at_us, -1, e.completed_at_us, e.execution_id))
        events.sort(key=lambda ev: (ev[0], ev[1], ev[3]))
    series: list[tuple[int, int]] = []
    now, in_flight = events[0][2] if events else 0, 0
    for _, delta, at, _ in events:
        now = max(now, at)
        in_flight += delta
        series.append((now, in_flight))
    span = history_span(history)
    if series and span is not None and span[1] > series[-1][0]:
        series.append((span[1], in_flight))
    return series


def window_counts(history: History, key: str, rate: RateEntry) -> list[tuple[int, int]]:
    """(claim time µs, claims of ``key`` in the closed window of ``rate.per_s`` seconds
    ending at it), per claim. INV-LIM-2 allows at most ``B + L·T/P`` claims in a window
    of T µs, so never more than ``B + L`` here while it holds."""
    times = _claim_times(history, key)
    period = rate.per_s * US_PER_S
    return [(t, j - bisect.bisect_left(times, t - period) + 1) for j, t in enumerate(times)]


def bucket_levels(history: History, key: str, rate: RateEntry) -> list[tuple[int, Fraction]]:
    """(claim time µs, tokens left after it in a bucket of ``rate`` that started FULL
    before the first claim and never refused), per claim.

    This is INV-LIM-2's window bound, exactly: the level after claim j is
    ``B − max_i((j−i+1) − L·(t_j−t_i)/P)``, so it goes below 0 exactly when some window
    holds more than ``B + L·T/P`` claims (integers in units of ``1/(P·10⁶)`` token, as
    the checker counts; the checker's second replay, from EMPTY, is stricter).
    """
    unit = rate.per_s * US_PER_S
    capacity = rate.burst * unit
    level, last = capacity, None
    out: list[tuple[int, Fraction]] = []
    for now in _claim_times(history, key):
        if last is not None:
            level = min(capacity, level + (now - last) * rate.limit)
        level, last = level - unit, now
        out.append((now, Fraction(level, unit)))
    return out


# --------------------------------------------------------------------------- pictures


def _canvas() -> tuple[Any, Any] | None:
    """matplotlib's ``Figure`` and Agg canvas, or None when matplotlib is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure, FigureCanvasAgg


def _text(value: object) -> str:
    """Data shown in a figure as typed: ``$`` would start matplotlib's math mode."""
    return str(value).replace("$", r"\$")


def _png(figure: Any, canvas: Any) -> bytes:
    canvas(figure)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    return out.getvalue()


def _finish(ax: Any, span: tuple[int, int] | None) -> None:
    """The whole round on the x axis (every picture of a round lines up), integer ticks,
    the legend outside the plot so it hides no data."""
    from matplotlib.ticker import MaxNLocator

    if span is not None:
        ax.set_xlim(0, max((span[1] - span[0]) / US_PER_S, 1e-3))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _seconds(times: list[int], origin: int) -> list[float]:
    return [(t - origin) / US_PER_S for t in times]


def _draw_inflight(mpl: tuple[Any, Any], key: str, histories: list[History], concurrency: int) -> bytes:
    figure_type, canvas = mpl
    figure = figure_type(figsize=(11, 2.6 * len(histories)))
    for row, history in enumerate(histories):
        ax = figure.add_subplot(len(histories), 1, row + 1)
        series, span = inflight_series(history, key), history_span(history)
        if series and span is not None:
            ax.step(_seconds([span[0], *(t for t, _ in series)], span[0]), [0, *(n for _, n in series)],
                    where="post", color="#1f5f99", label="in flight")
        ax.axhline(concurrency, color="#b22222", linestyle="--", label=f"concurrency {concurrency}")
        ax.set_ylim(0, concurrency + 1.5)
        ax.set_ylabel("executions")
        ax.set_title(_text(f"key {key!r}, round seed {history.seed}: in flight, "
                           f"at most {max((n for _, n in series), default=0)}"), fontsize=10)
        _finish(ax, span)
    ax.set_xlabel("seconds since the round's first claim")
    return _png(figure, canvas)


def _draw_rate(mpl: tuple[Any, Any], key: str, histories: list[History], rate: RateEntry) -> bytes:
    figure_type, canvas = mpl
    figure = figure_type(figsize=(11, 4.4 * len(histories)))
    label = f"{rate.limit} per {rate.per_s} s, burst {rate.burst}"
    for row, history in enumerate(histories):
        span = history_span(history)
        origin = span[0] if span is not None else 0
        counts, levels = window_counts(history, key, rate), bucket_levels(history, key, rate)
        top = figure.add_subplot(2 * len(histories), 1, 2 * row + 1)
        top.plot(_seconds([t for t, _ in counts], origin), [n for _, n in counts], ".", color="#1f5f99",
                 markersize=3, label=f"claims in the {rate.per_s} s\nbefore each claim")
        top.axhline(rate.burst + rate.limit, color="#b22222", linestyle="--",
                    label=f"B + L = {rate.burst + rate.limit}")
        top.set_ylim(0, (rate.burst + rate.limit) * 1.25)
        top.set_ylabel("claims")
        top.set_title(_text(f"key {key!r} ({label}), round seed {history.seed}: claims per window, "
                            f"at most {max((n for _, n in counts), default=0)}"), fontsize=10)
        _finish(top, span)
        bottom = figure.add_subplot(2 * len(histories), 1, 2 * row + 2, sharex=top)
        bottom.step(_seconds([t for t, _ in levels], origin), [float(v) for _, v in levels], where="post",
                    color="#1f5f99", label="tokens left in a bucket\nstarted full (INV-LIM-2)")
        bottom.axhline(0, color="#b22222", linestyle="--", label="0: below it, a window\nheld too many claims")
        bottom.set_ylim(min([-1.0, *(float(v) - 0.5 for _, v in levels)]), rate.burst + 0.5)
        bottom.set_ylabel("tokens")
        _finish(bottom, span)
    bottom.set_xlabel("seconds since the round's first claim")
    return _png(figure, canvas)


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key).lstrip(".") or "_"


def draw_pictures(histories: list[History]) -> list[tuple[str, str, bytes]] | None:
    """(file name, caption, PNG) per key with a concurrency and per rate entry of a key,
    over all rounds (one row per round); None without matplotlib."""
    mpl = _canvas()
    if mpl is None:
        return None
    limits = {key: entry for h in histories for key, entry in h.limits.items()}
    pictures: list[tuple[str, str, bytes]] = []
    names: set[str] = set()

    def name(stem: str) -> str:
        unique, n = stem, 1
        while unique in names:
            n, unique = n + 1, f"{stem}~{n + 1}"
        names.add(unique)
        return f"{unique}.png"

    for key in sorted(limits):
        entry = limits[key]
        if entry.concurrency is not None:
            pictures.append((name(f"inflight-{_slug(key)}"),
                             f"Executions of key {key!r} in flight over time, against its concurrency "
                             f"{entry.concurrency} (INV-LIM-1, counted in the key's claim/release order).",
                             _draw_inflight(mpl, key, histories, entry.concurrency)))
        for i, rate in enumerate(entry.rates):
            pictures.append((name(f"rate-{_slug(key)}-{i}"),
                             f"Claims of key {key!r} per {rate.per_s} s window against B + L = "
                             f"{rate.burst + rate.limit} ({rate.limit} per {rate.per_s} s, burst {rate.burst}); "
                             "below, the tokens a bucket started full would hold: INV-LIM-2's window "
                             "bound holds exactly when they never go below 0.",
                             _draw_rate(mpl, key, histories, rate)))
    return pictures


# --------------------------------------------------------------------------- page


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def masked_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (the orchestrator masks it already;
    masking again costs nothing and a report leaks no password if it did not)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in counts.items()) or "—"


def _table(headers: list[str], rows: list[list[str]], empty: str, nowrap: tuple[int, ...] = ()) -> str:
    """A table of cells already escaped (or built from escaped parts); ``nowrap``: the
    columns of short words that must not break (IDs, verdicts)."""
    if not rows:
        return f'<p class="none">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td{' class=nw' if i in nowrap else ''}>{cell}</td>"
                                    for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict(check: Check) -> str:
    if check.passed is None:
        return '<span class="skip">not run</span>'
    return '<span class="pass">passed</span>' if check.passed else '<span class="fail">FAILED</span>'


def _findings(check: Check) -> str:
    items = [*([check.detail] if check.detail else []), *check.findings[:5]]
    more = len(check.findings) - 5
    listed = "".join(f"<li>{_e(item)}</li>" for item in items)
    return (f"<ul>{listed}</ul>" if listed else "") + (f"<p class='more'>… {more} more</p>" if more > 0 else "")


def _checks(checks: list[Check], invariants: bool = False) -> str:
    rows = [[f"<b>{_e(c.id)}</b>", _e(STATEMENTS.get(c.id, c.statement) if invariants else c.statement),
             "<br>".join(f"<code>{_e(part.strip())}</code>" for part in c.checker.split(";")),
             _verdict(c), _e(_counts(c.counts)), _findings(c)]
            for c in checks]
    # (the checker column wraps between checkers: an invariant may have two)
    return _table(["ID", "Statement", "Checker", "Result", "Counts", "Details and first findings"], rows,
                  "none ran", nowrap=(0, 3))


def _tally(checks: list[Check]) -> str:
    passed = sum(c.passed is True for c in checks)
    failed = sum(c.passed is False for c in checks)
    skipped = sum(c.passed is None for c in checks)
    return f"{passed} passed, {failed} failed" + (f", {skipped} not run" if skipped else "")


def _banner(result: VerifyResult) -> str:
    checks, failed = result.checks, result.failed
    skipped = sum(c.passed is None for c in checks)
    if failed:
        ids = ", ".join(c.id for c in failed)
        return (f'<div class="banner bad"><h1>{len(failed)} failed: {_e(ids)}</h1>'
                f"<p>{len(checks)} checks on {_e(result.backend)}: {_e(_tally(checks))}.</p></div>")
    if not any(c.passed for c in checks):
        return '<div class="banner none"><h1>Nothing was checked</h1><p>No check ran to completion.</p></div>'
    note = f" ({skipped} not run: see below)" if skipped else ""
    return (f'<div class="banner ok"><h1>Passed</h1><p>{len(checks)} checks on {_e(result.backend)}: '
            f"{_e(_tally(checks))}{_e(note)}.</p></div>")


def _verified(result: VerifyResult) -> str:
    settings = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in sorted(result.settings.items()))
    limits = "".join(f"<tr><td>{_e(k)}</td><td><code>{_e(json.dumps(v, sort_keys=True, default=str))}</code></td>"
                     "</tr>" for k, v in sorted(result.limits.items()))
    pipelines = ", ".join(result.pipelines) or "none (the built-in workload only)"
    rows: list[tuple[str, object]] = [("ductwork", result.ductwork_version), ("Backend", result.backend),
            ("Server version", result.server_version)]
    cells = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    cells += (f"<tr><th>Settings read</th><td><table class='inner'>{settings or '<tr><td>none</td></tr>'}</table>"
              "</td></tr>")
    rows = [("Database URL", masked_url(result.database_url)), ("Seed", result.seed),
            ("Mode", "quick (--quick)" if result.quick else "full"), ("Started", result.started_at),
            ("Duration", f"{result.duration_s:.1f} s")]
    cells += "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows)
    cells += (f"<tr><th>Limits verified</th><td><table class='inner'>{limits or '<tr><td>none</td></tr>'}"
              f"</table></td></tr><tr><th>Adopter pipelines</th><td>{_e(pipelines)}</td></tr>")
    return f'<table class="facts">{cells}</table>'


def _rounds(result: VerifyResult) -> str:
    rows = []
    for r in result.rounds:
        violations = ", ".join(f"{inv}: {len(v)}" for inv, v in sorted(r.violations.items()) if v) or "none"
        rows.append([_e(r.seed), _e(_counts(r.counts)), _e(violations),
                     f"<code>{_e(r.history_path)}</code>", f"<code>{_e(r.replay)}</code>"])
    return _table(["Seed", "Counts", "Violations", "History", "Replay"], rows, "no chaos round ran", nowrap=(0,))


def _pictures(pictures: list[tuple[str, str, bytes]] | None, histories: list[History] | None) -> str:
    if not histories:
        return '<p class="none">No round histories were given: no pictures.</p>'
    if pictures is None:
        return f'<p class="none">{_e(NO_MATPLOTLIB)}.</p>'
    if not pictures:
        return '<p class="none">No key of the histories has a concurrency or a rate: no pictures.</p>'
    return "".join(f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,'
                   f'{base64.b64encode(png).decode("ascii")}"><figcaption>{_e(caption)} '
                   f"(<code>{_e(name)}</code>)</figcaption></figure>" for name, caption, png in pictures)


STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d2125;
margin:0 auto;max-width:1180px;padding:18px 26px 40px}
h1{font-size:1.6em;margin:0}h2{margin:1.6em 0 .5em;padding-bottom:.2em;border-bottom:2px solid #d6dbe0;font-size:1.25em}
.banner{padding:14px 20px;border-radius:6px;color:#fff}.banner p{margin:.3em 0 0}
.ok{background:#1e7b34}.bad{background:#b3261e}.banner.none{background:#6b7178}
table{border-collapse:collapse;width:100%;font-size:.92em}th,td{border:1px solid #d6dbe0;padding:5px 8px;
text-align:left;vertical-align:top;overflow-wrap:break-word}
td.nw,th{white-space:nowrap}thead th{background:#eef1f4}
table.facts th{width:12em;background:#f6f8fa}table.inner{width:auto}table.inner td{border:none;padding:1px 12px 1px 0}
td ul{margin:0;padding-left:1.1em}code{font-size:.9em;background:#f3f4f6;padding:0 3px;border-radius:3px}
.pass{color:#1e7b34;font-weight:600}.fail{color:#b3261e;font-weight:700}.skip{color:#6b7178;font-style:italic}
.none,.more{color:#6b7178}figure{margin:1em 0 2em}figure img{max-width:100%;border:1px solid #d6dbe0}
figcaption{font-size:.9em;color:#444}.notchecked li{margin:.2em 0}footer{margin-top:2em;color:#6b7178;font-size:.85em}
"""


def render_html(result: VerifyResult, pictures: list[tuple[str, str, bytes]] | None,
                histories: list[History] | None) -> str:
    """The page: verdict, what was verified, the checks, the rounds, pictures, what was not."""
    not_checked = result.not_checked or list(NOT_CHECKED_DEFAULT)

    def titled(title: str, checks: list[Check]) -> str:
        return f"{title} ({len(checks)}: {_tally(checks)})"

    sections = [
        ("What was verified", _verified(result)),
        (titled("Environment checks", result.environment), _checks(result.environment)),
        (titled("Conformance: engine against model", result.conformance), _checks(result.conformance)),
        (titled("Invariants on the chaos rounds' histories", result.invariants),
         _checks(result.invariants, invariants=True)),
        (f"Chaos rounds ({len(result.rounds)})", _rounds(result)),
        ("Pictures", _pictures(pictures, histories)),
        ("Not checked", '<ul class="notchecked">' + "".join(f"<li>{_e(item)}</li>" for item in not_checked)
         + "</ul>"),
    ]
    body = "".join(f"<section><h2>{_e(title)}</h2>{content}</section>" for title, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>ductwork verify: '
            f"{_e(result.backend)}, {_e(result.started_at)}</title><style>{STYLE}</style></head><body>"
            f"{_banner(result)}{body}<footer>ductwork verify {_e(result.ductwork_version)}; "
            f"the same findings as data: report.json</footer></body></html>\n")


def write_report(result: VerifyResult, directory: Path, histories: list[History] | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``report.html`` and the pictures (PNG) into ``directory``
    (created if missing); return every path written, by file name.

    ``report.json`` is written first, so the findings survive if drawing fails.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = {"report.json": result.write_json(directory / "report.json")}
    pictures = draw_pictures(histories) if histories else None
    for name, _, png in pictures or ():
        paths[name] = directory / name
        paths[name].write_bytes(png)
    paths["report.html"] = directory / "report.html"
    paths["report.html"].write_text(render_html(result, pictures, histories), encoding="utf-8")
    return paths


__all__ = ["NOT_CHECKED_DEFAULT", "bucket_levels", "draw_pictures", "history_span", "inflight_series",
           "masked_url", "render_html", "window_counts", "write_report"]
