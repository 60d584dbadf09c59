"""Template filters for figures a person reads (``{% load figures %}``): see ``console.figures``."""

from django import template

from console.figures import credits_display

register = template.Library()


@register.filter(name="credits")
def credits_filter(value) -> str:
    """``{{ amount|credits }}``: credits with the precision a person needs (``credits_display``)."""
    return credits_display(value)
