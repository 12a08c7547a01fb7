"""The wire contract: every request and response model of the HTTP API, pure pydantic.

One module per router of :mod:`dp_governor.api.routes`: ``reports`` (the report body, receipts,
the relay's batch), ``use_cases`` (published policies, budget groups, the device-wide budget),
``budgets`` (a device's budget), ``audit`` (the effective-epsilon report, timelines,
distributions, what-ifs), ``estimates`` and ``operations`` (errors, liveness, jobs, the chain's
verification). These import only :mod:`dp_governor.mechanisms`, never the server: the client
reads answers with them, and :mod:`dp_governor.api.wire` converts the read side's results to them.
"""

from dp_governor.api.schemas.audit import (
    BatchFigure,
    CentralLine,
    CentralLoss,
    DayFigure,
    DeviceLoss,
    DeviceTotals,
    Distribution,
    EffectiveEpsilonReport,
    LossSpread,
    PrivacyLoss,
    Series,
    Spread,
    Timeline,
    UseCaseLine,
    WhatIf,
)
from dp_governor.api.schemas.budgets import (
    BudgetStatus,
    DeviceBudget,
    DeviceOdometer,
    DeviceWide,
    QuotaStatus,
)
from dp_governor.api.schemas.estimates import (
    Discoveries,
    Discovery,
    EstimateItem,
    EstimateQuery,
    Estimates,
    IsoDay,
)
from dp_governor.api.schemas.operations import (
    AuditVerification,
    ErrorBody,
    Health,
    JobRelease,
    JobRun,
)
from dp_governor.api.schemas.reports import (
    REPORT_BODY_SCHEMAS,
    BatchItemResult,
    BatchResult,
    Receipt,
    ReportBody,
    batch_body,
)
from dp_governor.api.schemas.transparency import (
    ConsistencyProof,
    DeviceRecord,
    GateTotal,
    LeafProof,
    TlogCheckpoint,
)
from dp_governor.api.schemas.use_cases import (
    BudgetGroupPublic,
    DeviceBudgetPublic,
    GroupTerms,
    PolicyPublic,
    PublishedHashFamily,
    Randomizer,
)

__all__ = [
    "REPORT_BODY_SCHEMAS",
    "AuditVerification",
    "BatchFigure",
    "BatchItemResult",
    "BatchResult",
    "BudgetGroupPublic",
    "BudgetStatus",
    "CentralLine",
    "CentralLoss",
    "ConsistencyProof",
    "DayFigure",
    "DeviceBudget",
    "DeviceBudgetPublic",
    "DeviceLoss",
    "DeviceOdometer",
    "DeviceRecord",
    "DeviceTotals",
    "DeviceWide",
    "Discoveries",
    "Discovery",
    "Distribution",
    "EffectiveEpsilonReport",
    "ErrorBody",
    "EstimateItem",
    "EstimateQuery",
    "Estimates",
    "GateTotal",
    "GroupTerms",
    "Health",
    "IsoDay",
    "JobRelease",
    "JobRun",
    "LeafProof",
    "LossSpread",
    "PolicyPublic",
    "PrivacyLoss",
    "PublishedHashFamily",
    "QuotaStatus",
    "Randomizer",
    "Receipt",
    "ReportBody",
    "Series",
    "Spread",
    "Timeline",
    "TlogCheckpoint",
    "UseCaseLine",
    "WhatIf",
    "batch_body",
]
