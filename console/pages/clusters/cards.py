"""GPU management's changelist: Django's (search, filters, pagination) with the page of GPUs given as cards."""

from __future__ import annotations

import html

from django.contrib.admin.filters import AllValuesFieldListFilter
from django.utils import dateformat, timezone
from django.utils.safestring import SafeString, mark_safe

from console.changelist import LeanChangeList
from console.links import list_url, row_url_format
from console.pages.clusters import selectors as console
from console.reuse import reused
from console.scope import console_cluster


def escape(value) -> str:
    """``value`` HTML-escaped as Django's ``escape`` does it (``html.escape`` of its text), without its lazy-string
    wrapper, which cost more than the escaping on a page of cards."""
    return html.escape(str(value))


def _url_with_id(name: str) -> str:
    """The URL of ``name`` with a ``{}`` where the object's id goes (``console.links``)."""
    return row_url_format(name)


#: The columns a card reads (:func:`card_html`, :func:`console.pages.clusters.selectors.gpu_card`).
CARD_FIELDS = ("node", "cluster", "uuid", "index", "model", "memory_mib", "split_count", "cores", "health", "mode", "missing_since",
               "node__name", "node__labels", "cluster__name")


class GpuCardList(LeanChangeList):
    """Django's changelist whose page of GPUs is also given as ``cards`` (each with its links), with ``summary``
    (:func:`console.pages.clusters.selectors.gpu_summary`) over every GPU the filters keep; the summary's count is the paginator's
    (no COUNT query of its own)."""

    def known_count(self, request) -> int:  # noqa: D102
        if self._narrowed():
            self.summary, models = console.gpu_summary_and_models(self.queryset)
        else:
            # The whole list (of the scope): its totals may be a few seconds old (console.reuse).
            cluster = console_cluster(request)
            self.summary, models = reused(f"console:gpus:summary:{cluster.pk if cluster else 'all'}",
                                          lambda: console.gpu_summary_and_models(self.queryset))
        if not self._narrowed():
            # Nothing narrows the list: its models are the model filter's choices (Django's filter would read
            # every GPU again for them, SELECT DISTINCT).
            for spec in self.filter_specs:
                if isinstance(spec, AllValuesFieldListFilter) and spec.field_path == "model":
                    spec.lookup_choices = models
        return self.summary["gpus"]

    def page_queryset(self, qs):
        """The page's GPUs with only what a card shows (the node's and cluster's names, not their whole rows); the
        holders come from :func:`console.pages.clusters.selectors.live_holders` (plain rows) instead of the prefetch."""
        return qs.only(*CARD_FIELDS).prefetch_related(None)

    def page_rows(self, request, rows: list) -> list:  # noqa: D102
        change, cluster = _url_with_id("admin:clusters_gpudevice_change"), _url_with_id("admin:clusters_cluster_change")
        session = _url_with_id("admin:gpu_sessions_session_change")
        node_list = list_url("admin:clusters_gpudevice_changelist") + "?node={}"
        self.cards = []
        holders = console.live_holders([device.pk for device in rows]) if rows else {}
        utilization = console.gpu_utilization(rows, holders, now=timezone.now())
        for device in rows:
            card = console.gpu_card(device, holders.get(device.pk, []))
            card.utilization = utilization.get(device.pk)
            card.change_url, card.cluster_url = change.format(device.pk), cluster.format(device.cluster_id)
            card.node_url = node_list.format(device.node_id)
            card.holder_links = [(holder, session.format(holder.session_pk)) for holder in card.holders]
            card.html = card_html(card)
            self.cards.append(card)
        return rows


_STATE_BADGES = {
    "whole": '<span class="gs-badge gs-badge-warn" title="Held whole by one session: closed to shares">Whole</span>',
    "shared": '<span class="gs-badge gs-badge-info">Shared</span>',
    "full": '<span class="gs-badge gs-badge-warn" title="Every HAMi split slot is taken">Full</span>',
    "free": '<span class="gs-badge gs-badge-free">Free</span>',
}


def _meter_html(meter: console.Meter) -> str:
    text = escape(meter.text)
    over = ' <span class="gs-warning">over capacity</span>' if meter.over else ""
    return (
        f'<div class="gs-meter gs-{meter.level}" role="meter" aria-label="{escape(meter.label)}" aria-valuemin="0" '
        f'aria-valuemax="{meter.total}" aria-valuenow="{meter.used}" title="{escape(meter.label)}: {text} reserved ({meter.percent} %)">\n'
        f'  <div class="gs-meter-head"><span class="gs-meter-label">{escape(meter.label)}</span><span class="gs-meter-value">{text}{over}</span></div>\n'
        f'  <div class="gs-meter-track"><div class="gs-meter-fill" style="width: {meter.percent}%"></div></div>\n</div>\n'
    )


def _holder_html(holder: console.Holder, url: str) -> str:
    public_id, phase, owner = escape(holder.public_id), escape(holder.phase), escape(holder.owner)
    whole = " gs-share-whole" if holder.whole else ""
    return (
        f'        <li>\n          <a class="gs-session" href="{escape(url)}" title="{public_id} · {phase}">{public_id}</a>\n'
        f'          <span class="gs-owner" title="owner {owner}, {phase}"><span class="gs-owner-icon" aria-hidden="true">●</span> {owner}</span>\n'
        f'          <span class="gs-share{whole}">{escape(holder.share)}</span>\n        </li>\n'
    )


def physical_html(physical: console.Physical, device) -> str:
    """The card's physical line (memory and cores of the GPU itself) and, when HAMi scales them, what HAMi registers
    instead, labelled as such."""
    memory = f"{physical.memory_mib:,} MiB" if physical.memory_mib else "memory not reported"
    line = (f'    <div class="gs-physical" title="The GPU itself: memory from GPU feature discovery (nvidia.com/gpu.memory), '
            f'cores as 100 % of one GPU">Physical: <strong data-physical-memory>{escape(memory)}</strong> · '
            f'<strong data-physical-cores>100 %</strong> cores</div>\n')
    if not physical.scaled:
        return line
    parts = []
    if physical.memory_scaling:
        parts.append(f"{device.memory_mib:,} MiB (memory ×{physical.memory_scaling})")
    if physical.core_scaling:
        parts.append(f"{device.cores} % cores (×{physical.core_scaling})")
    return line + (f'    <div class="gs-scaled" title="HAMi registers the GPU with deviceMemoryScaling and core scaling applied; '
                   f'placement and the bars below count in these units">HAMi\'s scaled figures: <span data-hami-scaled>'
                   f'{escape(", ".join(parts))}</span></div>\n')


def _utilization_html(card: console.GpuCard) -> str:
    title = "SM utilization its Running sessions report for this GPU (HAMi's vGPU monitor, summed, at most 100 %)"
    if card.utilization is None:
        return (f'    <div class="gs-util gs-muted" data-utilization="" title="{title}: no fresh reading">'
                'SM utilization <strong>—</strong></div>\n')
    return (f'    <div class="gs-util" data-utilization="{card.utilization}" title="{title}">'
            f'SM utilization <strong>{card.utilization} %</strong></div>\n')


def card_html(card: console.GpuCard) -> SafeString:
    """One GPU card as HTML (every value escaped), built in Python once: a page of 48 cards through the template
    language cost several hundred variable lookups per card, most of the page's render time.

    ``card`` carries ``change_url``, ``node_url``, ``cluster_url`` and ``holder_links`` (:meth:`GpuCardList.page_rows`).
    """
    gpu = card.device
    uuid, node = escape(gpu.uuid), escape(gpu.node.name)
    if gpu.health:
        health = '<span class="gs-badge gs-badge-ok">Healthy</span>'
    else:
        since = ""
        if gpu.missing_since:
            when = dateformat.format(timezone.localtime(gpu.missing_since), "Y-m-d H:i")
            since = f'title="missing from the operator\'s report since {escape(when)} UTC"'
        health = f'<span class="gs-badge gs-badge-bad" {since}>Unhealthy</span>'
    mode = f'<code class="gs-mode" title="HAMi mode">{escape(gpu.mode)}</code>' if gpu.mode else ""
    physical = physical_html(card.physical, gpu) if card.physical else ""
    if card.holder_links:
        holders = "      <ul>\n" + "".join(_holder_html(h, url) for h, url in card.holder_links) + "      </ul>\n"
    else:
        holders = '      <p class="gs-muted">No session on this GPU</p>\n'
    return mark_safe(  # noqa: S308 - every value above is escaped
        f'  <article class="gs-card gs-state-{card.state}" data-gpu-uuid="{uuid}" aria-label="GPU {gpu.index} on {node}">\n'
        f'    <header class="gs-card-head">\n'
        f'      <a class="gs-card-title" href="{escape(card.change_url)}">{escape(gpu.model)}</a>\n'
        f'      <span class="gs-index" title="GPU index on the node">#{gpu.index}</span>\n    </header>\n'
        f'    <div class="gs-card-where">\n'
        f'      <a class="gs-node" href="{escape(card.node_url)}" title="All GPUs of {node}">{node}</a>\n'
        f'      <span class="gs-muted">on</span> <a class="gs-nowrap" href="{escape(card.cluster_url)}">{escape(gpu.cluster.name)}</a>\n'
        f'    </div>\n    <div class="gs-card-badges">\n        {health}\n        {_STATE_BADGES.get(card.state, "")}\n      {mode}\n    </div>\n'
        f'    <div class="gs-uuid">\n      <code title="{uuid}">{escape(card.short_uuid)}</code>\n'
        f'      <button type="button" class="gs-copy" data-copy="{uuid}" aria-label="Copy UUID {uuid}" title="Copy {uuid}">Copy UUID</button>\n'
        f'    </div>\n{physical}    <div class="gs-meters">\n      {"".join(_meter_html(m) for m in card.meters)}    </div>\n'
        f'{_utilization_html(card)}'
        f'    <section class="gs-holders" aria-label="Sessions on this GPU">\n{holders}    </section>\n  </article>\n'
    )
