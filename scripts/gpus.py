"""`gputrain gpus [MODEL|MEMORY+] [--spot] [--region R]`: what the catalog offers, like
`sky show-gpus`: pure, no cloud call, no heavy import."""

from __future__ import annotations

from infra.base.errors import UserError
from scripts import ui


def show_gpus(what: str | None, *, spot: bool, region: str | None) -> None:
    from infra.offer_tables import LISTING_HEADERS, gpu_offerings, listing_rows
    from infra.offers import price_table

    offerings = gpu_offerings(what, spot=spot, region=region)
    if not offerings:
        where = f" in {region}" if region else ""
        raise UserError(
            f"gpus: nothing offers {what or 'a GPU'}{where}; `gputrain gpus"
            f"{f' --region {region}' if region else ''}` lists what is offered"
        )
    mode = "Spot" if spot else "on-demand"
    where = f" in {region}" if region else ""
    ui.table(f"GPUs, {mode}{where}", LISTING_HEADERS, listing_rows(offerings, spot))
    table = price_table()
    ui.say(f"Prices: USD per GPU-hour, {mode}, from {table.source}, as of {table.as_of}.")
    ui.say("Ask for them in a stack: gputrain:gpus: MODEL:COUNT (e.g. H100:16) or 40GB+:8.")
