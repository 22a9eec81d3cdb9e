"""Like modules/ui_components.py (v1.6+): InputAccordion is a hidden gr.Checkbox that opens a gr.Accordion."""

from __future__ import annotations

from typing import Any

import gradio as gr


class InputAccordion(gr.Checkbox):
    """Its value (checked = open) is the script arg; used as a context manager around the controls."""

    def __init__(self, value: bool, **kwargs: Any) -> None:
        self.accordion_id = kwargs.get("elem_id") or "input-accordion"
        super().__init__(value, **{**kwargs, "elem_id": f"{self.accordion_id}-checkbox", "visible": False})
        self.change(
            fn=None, _js=f'function(checked){{ inputAccordionChecked("{self.accordion_id}", checked); }}', inputs=[self]
        )
        self.accordion = gr.Accordion(
            **{
                **kwargs,
                "elem_id": self.accordion_id,
                "label": kwargs.get("label", "Accordion"),
                "elem_classes": ["input-accordion"],
                "open": value,
            }
        )

    def extra(self) -> gr.Column:
        return gr.Column(elem_id=self.accordion_id + "-extra", elem_classes="input-accordion-extra", min_width=0)

    def __enter__(self) -> InputAccordion:
        self.accordion.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.accordion.__exit__(*exc)

    def get_block_name(self) -> str:
        return "checkbox"
