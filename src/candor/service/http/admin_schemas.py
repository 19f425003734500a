"""Request bodies and views of the admin routes (§8.3 `/v1/keys`, `/v1/subscriptions`, §9.7 deliveries).

Bodies forbid unknown fields (S-96) and only check shapes; the admin actions own the rules that need settings or
state (the webhook target policy, the subscription limit, the last admin key). Views never carry a secret or a
hash: the key secret and the signing secret appear only in the creation answers (`CreatedKeyView`,
`CreatedSubscriptionView`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from ..admin.keys import KeyCreated
from ..admin.rows import CreatedKey, DeliveryRow, PrincipalRow, SubscriptionRow
from ..admin.rules import NAME_LIMIT, URL_LIMIT, EventType
from .omittable import Omittable

__all__ = (
    "CreateKeyBody",
    "UpdateKeyBody",
    "KeyView",
    "CreatedKeyView",
    "KeyPage",
    "SubscriptionFilter",
    "CreateSubscriptionBody",
    "UpdateSubscriptionBody",
    "SubscriptionView",
    "CreatedSubscriptionView",
    "SubscriptionPage",
    "DeliveryView",
    "DeliveryPage",
)

Permission = Literal["read", "run", "admin"]
Name = Annotated[str, Field(min_length=1, max_length=NAME_LIMIT)]
Url = Annotated[str, Field(min_length=1, max_length=URL_LIMIT)]
"""`https://…` (`http://` only with `control.webhook_allow_insecure`)."""
EventTypes = Annotated[list[EventType], Field(min_length=1)]


def _at(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def given(self) -> dict[str, Any]:
        """The fields the client sent, as JSON values (a PATCH changes only these)."""
        return self.model_dump(mode="json", exclude_unset=True)


# --- keys --------------------------------------------------------------------------------------------------------


class CreateKeyBody(_Body):
    """`POST /v1/keys`."""

    name: Name
    permissions: list[Permission]


class UpdateKeyBody(_Body):
    """`PATCH /v1/keys/{key_id}`: omitted fields stay as they are."""

    permissions: Omittable[list[Permission]] = None
    """Replaces the key's permissions."""
    disabled: Omittable[bool] = None
    """`true` disables the key (it authenticates no more); `false` enables it again."""


class KeyView(BaseModel):
    """A principal (API key), never its secret or hash."""

    id: str
    name: str
    permissions: list[Permission]
    disabled: bool
    disabled_at: AwareDatetime | None
    version: int
    created_at: AwareDatetime

    @classmethod
    def of(cls, row: PrincipalRow) -> KeyView:
        return cls(
            id=row.id,
            name=row.name,
            permissions=sorted(row.permissions),
            disabled=row.disabled_at is not None,
            disabled_at=_at(row.disabled_at),
            version=row.version,
            created_at=_at(row.created_at),
        )


class CreatedKeyView(KeyView):
    """The creation answer: the only place the secret is ever shown."""

    secret: str | None
    """The bearer secret, shown this once; `null` when the answer replays an earlier create (same
    `Idempotency-Key`): only a hash of it is stored."""

    @classmethod
    def created(cls, key: CreatedKey | KeyCreated) -> CreatedKeyView:
        return cls(**KeyView.of(key.principal).model_dump(), secret=key.secret)


class KeyPage(BaseModel):
    """§8.1 list shape, oldest key first."""

    items: list[KeyView]
    next_cursor: str | None


# --- subscriptions -----------------------------------------------------------------------------------------------


class SubscriptionFilter(_Body):
    """§9.3: a run matches when every given field equals the run's."""

    agent: str | None = Field(None, min_length=1)
    thread_id: str | None = Field(None, min_length=1)


class CreateSubscriptionBody(_Body):
    """`POST /v1/subscriptions`."""

    name: Name
    url: Url
    events: EventTypes
    filter: SubscriptionFilter | None = None
    enabled: bool = True

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of `admin.subscriptions.create_subscription`."""
        return {
            "name": self.name,
            "url": self.url,
            "events": list(self.events),
            "enabled": self.enabled,
            "filter": None if self.filter is None else self.filter.given(),
        }


class UpdateSubscriptionBody(_Body):
    """`PATCH /v1/subscriptions/{sub_id}`: omitted fields stay as they are; `filter` is replaced whole."""

    name: Omittable[Name] = None
    url: Omittable[Url] = None
    events: Omittable[EventTypes] = None
    filter: Omittable[SubscriptionFilter] = None
    """`{}` clears the filter."""
    enabled: Omittable[bool] = None


class SubscriptionView(BaseModel):
    """A webhook subscription, never its signing secret."""

    id: str
    name: str
    url: str
    events: list[str]
    filter: dict[str, str]
    enabled: bool
    version: int
    created_by_id: str
    updated_by_id: str
    created_at: AwareDatetime
    updated_at: AwareDatetime

    @classmethod
    def of(cls, row: SubscriptionRow) -> SubscriptionView:
        return cls(
            id=row.id,
            name=row.name,
            url=row.url,
            events=list(row.events),
            filter=row.filter,
            enabled=row.enabled,
            version=row.version,
            created_by_id=row.created_by_id,
            updated_by_id=row.updated_by_id,
            created_at=_at(row.created_at),
            updated_at=_at(row.updated_at),
        )


class CreatedSubscriptionView(SubscriptionView):
    """The creation answer: the only place the signing secret is ever shown (verify deliveries with it)."""

    signing_secret: str


class SubscriptionPage(BaseModel):
    """§8.1 list shape, oldest subscription first."""

    items: list[SubscriptionView]
    next_cursor: str | None


# --- deliveries --------------------------------------------------------------------------------------------------


class DeliveryView(BaseModel):
    """One webhook outbox row of a subscription (§9.7); `id` is the `Candor-Delivery-Id` the receiver saw."""

    id: str
    subscription_id: str
    event_type: str
    status: Literal["pending", "delivered", "dead"]
    attempts: int
    available_at: AwareDatetime
    last_error: str | None
    created_at: AwareDatetime
    delivered_at: AwareDatetime | None
    settled_at: AwareDatetime | None

    @classmethod
    def of(cls, row: DeliveryRow) -> DeliveryView:
        return cls(
            id=row.id,
            subscription_id=row.subscription_id,
            event_type=row.event_type,
            status=row.status,
            attempts=row.attempts,
            available_at=_at(row.available_at),
            last_error=row.last_error,
            created_at=_at(row.created_at),
            delivered_at=_at(row.delivered_at),
            settled_at=_at(row.settled_at),
        )


class DeliveryPage(BaseModel):
    """§8.1 list shape, newest delivery first."""

    items: list[DeliveryView]
    next_cursor: str | None
