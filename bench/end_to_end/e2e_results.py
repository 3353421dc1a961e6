"""Reading a result document of the end-to-end comparison: its successful runs, and whether
two runs recorded bitwise the same steps."""

from __future__ import annotations

from typing import Any, Dict, Tuple

import e2e_common as common


def ok_runs(doc: Dict[str, Any]) -> Dict[Tuple[str, str, bool], Dict[str, Any]]:
    return {(r["workload"], r["allocator"], r.get("control", False)): r
            for r in doc["runs"] if r["status"] == "ok"}


def compare_records(reference: Dict[str, Any], other: Dict[str, Any]) -> Dict[str, Any]:
    """Bitwise comparison of two runs' per-step records (and their shape schedules)."""
    ref, oth = reference["result"], other["result"]
    if ref.get("schedule") != oth.get("schedule"):
        return {"identical": False, "reason": "different shape schedules (seed or code differs)",
                "step": None}
    step = common.first_difference(ref.get("records", []), oth.get("records", []))
    if step is None:
        return {"identical": True, "step": None}
    records_ref, records_oth = ref.get("records", []), oth.get("records", [])
    return {"identical": False, "step": step,
            "reference_value": records_ref[step] if step < len(records_ref) else None,
            "value": records_oth[step] if step < len(records_oth) else None,
            "reason": f"step {step} differs ({ref.get('record_kind')})"}
