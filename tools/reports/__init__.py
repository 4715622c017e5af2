"""Improvement documents and status summaries, rebuilt from the ledger alone, under docs_out/<session>/.

- `NN-slug.md`, one per plan item: title, tier, rationale, expected impact, implementation (the exact flags or
  the code change), risks, status and, once tested, the result (before and after with experiment ids, the
  change in %, the verdict and its reason, and how that compares with the expected impact). Tier 3 items are
  changes for the user to make: they are documented, never given a measured or simulated gain.
- `status-NNN.md`: Best results, What was tried, Ruled out, Root cause, Next steps, Question; with `html`, also
  `status-NNN.html` (markdown-it-py, tables on) and charts under `charts/` (matplotlib PNGs).

Every number comes from a ledger row (benchmark levels, telemetry, experiments, the plan, analysis findings) or
from a formula the document names. Rendering is idempotent: the same ledger gives the same bytes, and a file
whose content would not change is not touched. A file edited by hand since pivot wrote it (its sha256 differs
from the one the ledger recorded) is never overwritten: the new version goes beside it (`NAME.new.md`) and
pivot says so. This package imports nothing from tools/: analysis findings arrive as ledger rows.

The modules: `common` (headings, verdict words, the session the reports read), `text` (Markdown checks and
formatting), `expectations` (expected impacts as numbers, next steps), `ledger` (the `Ledger` read model),
`writing` (files under docs_out/, hand edits, the documents table), `improvement` (improvement documents),
`status` (status summaries), `html` and `charts` (the HTML rendering and its PNG charts; matplotlib is imported
only when charts are drawn). Only this package writes under docs_out/.
"""

from tools.reports.common import (
    CHANGE_FORMULA,
    FINISHED_QUESTION,
    IMPROVEMENT_HEADINGS,
    KEPT_VERDICTS,
    SET_ASIDE,
    STATUS_HEADINGS,
    VERDICT_WORDS,
    SessionLike,
    SessionRef,
)
from tools.reports.expectations import Expectation, next_steps, parse_expectation
from tools.reports.html import write_status_html
from tools.reports.improvement import (
    item_status,
    render_improvement,
    write_improvement_doc,
    write_improvement_docs,
)
from tools.reports.ledger import Ledger, config_text, plan_warnings
from tools.reports.status import (
    BEST_ALIGN,
    BEST_HEADER,
    Summary,
    complete_status,
    prediction_text,
    render_status,
    usage_text,
    write_status_summary,
)
from tools.reports.text import check_document, headings, markdown, slug, tables
from tools.reports.writing import latest_status_doc, list_documents

__all__ = [
    "BEST_ALIGN",
    "BEST_HEADER",
    "CHANGE_FORMULA",
    "FINISHED_QUESTION",
    "IMPROVEMENT_HEADINGS",
    "KEPT_VERDICTS",
    "SET_ASIDE",
    "STATUS_HEADINGS",
    "VERDICT_WORDS",
    "Expectation",
    "Ledger",
    "SessionLike",
    "SessionRef",
    "Summary",
    "check_document",
    "complete_status",
    "config_text",
    "headings",
    "item_status",
    "latest_status_doc",
    "list_documents",
    "markdown",
    "next_steps",
    "parse_expectation",
    "plan_warnings",
    "prediction_text",
    "render_improvement",
    "render_status",
    "slug",
    "tables",
    "usage_text",
    "write_improvement_doc",
    "write_improvement_docs",
    "write_status_html",
    "write_status_summary",
]
