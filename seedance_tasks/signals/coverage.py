"""metrics-blind-spot: the metrics the other rules need (or would use) that the source lacks, so the
audit says what it cannot see instead of staying silent."""

from __future__ import annotations

from datetime import date

from seedance_tasks.signals.model import Finding


class MetricsBlindSpot:
    id = "metrics-blind-spot"
    family = "coverage"
    needs = ("metrics",)
    metrics: tuple[str, ...] = ()
    description = "metrics a rule needs that the source does not have (e.g. DCGM_FI_PROF_DRAM_ACTIVE)"

    def evaluate(self, day: date, inputs) -> list[Finding]:
        from seedance_tasks.signals.registry import RULES

        have = inputs.metric_names(day)
        findings = []
        for rule in RULES.values():
            missing = sorted(set(rule.metrics) - have)
            optional = sorted(set(getattr(rule, "optional_metrics", ())) - have)
            if not missing and not optional:
                continue
            what = "cannot run" if missing else "runs without"
            findings.append(Finding(
                self.id, rule.id, "info",
                f"{rule.id} {what} {', '.join(missing or optional)}",
                {"missing": missing, "missing_optional": optional},
            ))
        return findings
