"""Checks shared by the console tests (``tests/*/test_admin.py``), through Django's test client on the real admin URLs."""

from __future__ import annotations

import html

#: What a change page that lets you save or delete shows (the submit row and its buttons).
EDIT_MARKERS = ('class="submit-row"', 'name="_save"', 'name="_continue"', 'name="_addanother"', 'class="deletelink"')


def page_text(response) -> str:
    """The response's HTML with entities decoded (``'`` is ``&#x27;`` in the page)."""
    return html.unescape(response.content.decode())


def assert_read_only(console, url: str, row) -> None:
    """Assert the console only shows ``row`` on its pages under ``url`` (e.g. ``/clusters/node/``).

    The change page renders with no submit row (no Save, no Delete); the changelist offers no delete action; the
    add page, a POST to the change page, a POST to the delete URL and the changelist's ``delete_selected`` action
    all answer 403; the row is still there, unchanged.
    """
    model = type(row)
    before = model.objects.filter(pk=row.pk).values().get()
    page = console.get(f"{url}{row.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    for marker in EDIT_MARKERS:
        assert marker not in text, f"{url}{row.pk}/change/ shows {marker}"
    changelist = console.get(url)
    assert changelist.status_code == 200 and 'value="delete_selected"' not in changelist.content.decode()
    assert console.get(f"{url}add/").status_code == 403
    assert console.post(f"{url}{row.pk}/change/", {}).status_code == 403
    assert console.get(f"{url}{row.pk}/delete/").status_code == 403
    assert console.post(f"{url}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    action = console.post(url, {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes", "index": 0})
    assert action.status_code == 403
    assert model.objects.filter(pk=row.pk).values().get() == before
