"""The database schema (SQLAlchemy Core). Migrations under ``migrations/`` must replay to exactly this."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every database (SQLite keeps no zone)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType: sa.types.TypeEngine[Any] = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _ts(name: str, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, UTCDateTime(), nullable=nullable)


orgs = sa.Table(
    "orgs",
    metadata,
    sa.Column("id", sa.String(50), primary_key=True),
    sa.Column("uuid", sa.Uuid(), nullable=False, unique=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("created_by", sa.String(100), nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    # NULL org: a platform-wide token (the bootstrap token).
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=True),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Column("description", sa.String(200), nullable=False),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("prefix", sa.String(16), nullable=False),
    _ts("created_at"),
    _ts("expires_at", nullable=True),
)

env_types = sa.Table(
    "env_types",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("uuid", sa.Uuid(), nullable=False, unique=True),
    sa.Column("display_name", sa.String(60), nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
)

projects = sa.Table(
    "projects",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("uuid", sa.Uuid(), nullable=False, unique=True),
    sa.Column("display_name", sa.String(60), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
)

runners = sa.Table(
    "runners",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("description", sa.String(500), nullable=True),
    sa.Column("type", sa.String(40), nullable=False),
    # The runner configuration with every sensitive value replaced by "SECRET" ...
    sa.Column("configuration", JSONType, nullable=False),
    # ... and those values, sealed with the server key (NULL when the configuration has none).
    sa.Column("config_secret", sa.Text(), nullable=True),
    sa.Column("state_type", sa.String(40), nullable=False),
    sa.Column("state_configuration", JSONType, nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
)

envs = sa.Table(
    "envs",
    metadata,
    sa.Column("org_id", sa.String(50), primary_key=True),
    sa.Column("project_id", sa.String(64), primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("uuid", sa.Uuid(), nullable=False, unique=True),
    sa.Column("env_type_id", sa.String(64), nullable=False),
    sa.Column("display_name", sa.String(60), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.String(1000), nullable=True),
    sa.Column("runner_id", sa.String(64), nullable=True),
    # The tags a managed runner must carry, copied from the rule that linked the environment (NULL: none).
    sa.Column("required_tags", JSONType, nullable=True),
    _ts("created_at"),
    _ts("updated_at"),
    sa.ForeignKeyConstraint(
        ["org_id", "project_id"], ["projects.org_id", "projects.id"], ondelete="RESTRICT"
    ),
    sa.ForeignKeyConstraint(
        ["org_id", "env_type_id"], ["env_types.org_id", "env_types.id"], ondelete="RESTRICT"
    ),
    sa.ForeignKeyConstraint(["org_id", "runner_id"], ["runners.org_id", "runners.id"], ondelete="RESTRICT"),
)
sa.Index("ix_envs_org_runner", envs.c.org_id, envs.c.runner_id)
sa.Index("ix_envs_org_env_type", envs.c.org_id, envs.c.env_type_id)

runner_rules = sa.Table(
    "runner_rules",
    metadata,
    sa.Column("org_id", sa.String(50), nullable=False),
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("runner_id", sa.String(64), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=True),
    sa.Column("env_type_id", sa.String(64), nullable=True),
    # Only with runner "managed": the tags a managed runner must carry (NULL: none).
    sa.Column("required_tags", JSONType, nullable=True),
    _ts("created_at"),
    sa.ForeignKeyConstraint(["org_id", "runner_id"], ["runners.org_id", "runners.id"], ondelete="CASCADE"),
    sa.ForeignKeyConstraint(["org_id", "project_id"], ["projects.org_id", "projects.id"], ondelete="CASCADE"),
    sa.ForeignKeyConstraint(
        ["org_id", "env_type_id"], ["env_types.org_id", "env_types.id"], ondelete="CASCADE"
    ),
)
# At most one rule per (org, project_id, env_type_id), NULLs included.
sa.Index(
    "uq_runner_rules_match",
    runner_rules.c.org_id,
    sa.func.coalesce(runner_rules.c.project_id, ""),
    sa.func.coalesce(runner_rules.c.env_type_id, ""),
    unique=True,
)
sa.Index("ix_runner_rules_org_runner", runner_rules.c.org_id, runner_rules.c.runner_id, runner_rules.c.id)

# --- module catalogue ---
# Resource types, module providers, modules with their immutable versions, and module rules.
# Upstream keeps the same shapes (CP migrations 000003-000010); built-in types are rows with built_in = true.

resource_types = sa.Table(
    "resource_types",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("description", sa.String(200), nullable=True),
    sa.Column("output_schema", JSONType, nullable=False),
    sa.Column("is_developer_accessible", sa.Boolean(), nullable=False),
    sa.Column("built_in", sa.Boolean(), nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
)

module_providers = sa.Table(
    "module_providers",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("provider_type", sa.String(100), primary_key=True),
    sa.Column("id", sa.String(100), primary_key=True),
    sa.Column("description", sa.String(200), nullable=True),
    sa.Column("source", sa.String(100), nullable=False),
    sa.Column("version_constraint", sa.String(100), nullable=False),
    # As answered: "SECRET" for each credential (domain.provider_secrets). The whole configuration is
    # sealed with the server key in configuration_sealed (NULL: a row from before; sealed at start-up).
    sa.Column("configuration", JSONType, nullable=False),
    sa.Column("configuration_sealed", sa.Text(), nullable=True),
    _ts("created_at"),
    _ts("updated_at"),
)


def _module_content() -> list[sa.Column[Any]]:
    """The fields a module version snapshots: everything but identity, resource type and timestamps."""
    return [
        sa.Column("description", sa.String(200), nullable=True),
        # A module source address (git::https://..., registry coordinate, absolute path) or "inline".
        sa.Column("module_source", sa.String(200), nullable=False),
        # The HCL of an inline module (module_source == "inline"), else NULL.
        sa.Column("module_source_code", sa.Text(), nullable=True),
        sa.Column("module_params", JSONType, nullable=False),
        sa.Column("module_inputs", JSONType, nullable=False),
        sa.Column("provider_mapping", JSONType, nullable=False),
        sa.Column("dependencies", JSONType, nullable=False),
        sa.Column("coprovisioned", JSONType, nullable=False),
    ]


modules = sa.Table(
    "modules",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("id", sa.String(100), primary_key=True),
    sa.Column("uuid", sa.Uuid(), nullable=False, unique=True),
    # Fixed at creation: module rules copy it for their uniqueness key.
    sa.Column("resource_type", sa.String(64), nullable=False),
    *_module_content(),
    # The module_versions row holding this content (written in the same transaction).
    sa.Column("version_id", sa.Uuid(), nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
    sa.ForeignKeyConstraint(
        ["org_id", "resource_type"], ["resource_types.org_id", "resource_types.id"], ondelete="RESTRICT"
    ),
)
sa.Index("ix_modules_org_resource_type", modules.c.org_id, modules.c.resource_type)

module_versions = sa.Table(
    "module_versions",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("org_id", sa.String(50), nullable=False),
    sa.Column("module_id", sa.String(100), nullable=False),
    sa.Column("resource_type", sa.String(64), nullable=False),
    *_module_content(),
    _ts("created_at"),
    sa.ForeignKeyConstraint(["org_id", "module_id"], ["modules.org_id", "modules.id"], ondelete="CASCADE"),
)
sa.Index(
    "ix_module_versions_org_module_created",
    module_versions.c.org_id,
    module_versions.c.module_id,
    module_versions.c.created_at,
    module_versions.c.id,
)

module_rules = sa.Table(
    "module_rules",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("org_id", sa.String(50), nullable=False),
    sa.Column("module_id", sa.String(100), nullable=False),
    # Copied from the module (fixed there), so that uniqueness and listing need no join.
    sa.Column("resource_type", sa.String(64), nullable=False),
    # Always set: a rule created without a class matches the class "default" (upstream).
    sa.Column("resource_class", sa.String(63), nullable=False),
    sa.Column("resource_id", sa.String(63), nullable=True),
    sa.Column("project_id", sa.String(64), nullable=True),
    sa.Column("env_type_id", sa.String(64), nullable=True),
    sa.Column("env_id", sa.String(64), nullable=True),
    _ts("created_at"),
    sa.CheckConstraint(
        "env_id IS NULL OR (project_id IS NOT NULL AND env_type_id IS NULL)", name="ck_module_rules_env_scope"
    ),
    sa.ForeignKeyConstraint(["org_id", "module_id"], ["modules.org_id", "modules.id"], ondelete="RESTRICT"),
    sa.ForeignKeyConstraint(["org_id", "project_id"], ["projects.org_id", "projects.id"], ondelete="CASCADE"),
    sa.ForeignKeyConstraint(
        ["org_id", "env_type_id"], ["env_types.org_id", "env_types.id"], ondelete="CASCADE"
    ),
    sa.ForeignKeyConstraint(
        ["org_id", "project_id", "env_id"], ["envs.org_id", "envs.project_id", "envs.id"], ondelete="CASCADE"
    ),
)
# At most one rule per match key of a resource type, NULLs included (upstream: IS NOT DISTINCT FROM).
sa.Index(
    "uq_module_rules_match",
    module_rules.c.org_id,
    module_rules.c.resource_type,
    module_rules.c.resource_class,
    sa.func.coalesce(module_rules.c.resource_id, ""),
    sa.func.coalesce(module_rules.c.project_id, ""),
    sa.func.coalesce(module_rules.c.env_type_id, ""),
    sa.func.coalesce(module_rules.c.env_id, ""),
    unique=True,
)
sa.Index(
    "ix_module_rules_listing",
    module_rules.c.org_id,
    module_rules.c.resource_type,
    module_rules.c.module_id,
    module_rules.c.resource_class,
    module_rules.c.id,
)
sa.Index("ix_module_rules_org_module", module_rules.c.org_id, module_rules.c.module_id)


# --- deployments and state ---------------------------------------------------------------------------

deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("env_id", sa.String(64), nullable=False),
    # The environment's lifecycle id: state is keyed by it, and a recreated environment starts afresh.
    sa.Column("env_uuid", sa.Uuid(), nullable=False),
    sa.Column("runner_id", sa.String(64), nullable=False),
    # Runner "managed": the tags the managed runner that claims it must carry (its environment's; NULL: none).
    sa.Column("required_tags", JSONType, nullable=True),
    sa.Column("mode", sa.String(20), nullable=False),
    sa.Column("plan_only", sa.Boolean(), nullable=False),
    sa.Column("rollback_to_deployment_id", sa.Uuid(), nullable=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("status_message", sa.String(4000), nullable=False),
    sa.Column("manifest", JSONType, nullable=False),
    # The compiled root module (main.tf), answered by GET .../tf.
    sa.Column("tf", sa.Text(), nullable=False),
    # The compiled nodes (resource -> module), for diffs against later deployments.
    sa.Column("graph", JSONType, nullable=False),
    sa.Column("bundle_key", sa.String(300), nullable=False),
    sa.Column("encrypted_outputs_recipient", sa.String(200), nullable=True),
    sa.Column("encrypted_logs_recipient", sa.String(200), nullable=True),
    sa.Column("runner_log_level", sa.String(10), nullable=False),
    sa.Column("idempotency_key_digest", sa.String(64), nullable=True),
    sa.Column("request_digest", sa.String(64), nullable=False),
    sa.Column("created_by", sa.String(100), nullable=False),
    _ts("created_at"),
    _ts("updated_at"),
    _ts("completed_at", nullable=True),
    # Results: age ciphertext of the outputs (base64), counts, the error; only ever ciphertext.
    sa.Column("outputs", sa.Text(), nullable=True),
    sa.Column("metrics", JSONType, nullable=False),
    sa.Column("error", JSONType, nullable=True),
    # SHA-256 of the applied results (canonical JSON): a repeat is recognised, a different result refused.
    sa.Column("results_digest", sa.String(64), nullable=True),
    sa.Column("logs_key", sa.String(300), nullable=True),
    sa.Column("logs_size", sa.Integer(), nullable=True),
    # Dispatch: pending -> launched -> done; claims are leases, so a crashed replica's work is taken over.
    sa.Column("dispatch_state", sa.String(20), nullable=False),
    sa.Column("dispatch_owner", sa.String(200), nullable=True),
    _ts("dispatch_lease_until", nullable=True),
    sa.Column("dispatch_attempts", sa.Integer(), nullable=False),
    sa.Column("handle", sa.String(500), nullable=True),
    # The launcher's note on how it launched the run (e.g. TOKEN in the Job's spec: no RBAC for Secrets).
    sa.Column("launch_note", sa.String(1000), nullable=True),
    _ts("launched_at", nullable=True),
    _ts("next_check_at", nullable=True),
    _ts("exited_at", nullable=True),
    _ts("timeout_at"),
    # When the retention worker deleted the deployment's objects (bundle, logs) from the object store:
    # PO_OBJECT_RETENTION_DAYS after it finished, or once its environment was deleted. NULL: still kept.
    _ts("objects_deleted_at", nullable=True),
    # A cancel was asked for (by whom: the token id): the run is being stopped, and the deployment ends
    # ``cancelled`` whatever its runner reports, unless it succeeded first.
    _ts("cancel_requested_at", nullable=True),
    sa.Column("cancel_requested_by", sa.String(100), nullable=True),
    # When the dispatcher told the run's launcher to stop it (once).
    _ts("cancel_sent_at", nullable=True),
)
# One executing deployment per environment, enforced by the database.
sa.Index(
    "uq_deployments_executing",
    deployments.c.env_uuid,
    unique=True,
    sqlite_where=deployments.c.status == "executing",
    postgresql_where=deployments.c.status == "executing",
)
sa.Index(
    "uq_deployments_idempotency", deployments.c.org_id, deployments.c.idempotency_key_digest, unique=True
)
sa.Index("ix_deployments_org_created", deployments.c.org_id, deployments.c.created_at)
sa.Index("ix_deployments_env_created", deployments.c.env_uuid, deployments.c.created_at)
sa.Index("ix_deployments_dispatch", deployments.c.dispatch_state, deployments.c.next_check_at)
# The retention worker's candidates: deployments whose objects are still kept, oldest first.
sa.Index(
    "ix_deployments_objects_kept",
    deployments.c.completed_at,
    sqlite_where=deployments.c.objects_deleted_at.is_(None),
    postgresql_where=deployments.c.objects_deleted_at.is_(None),
)

# The live log (issue 22): chunks of the runner's log as it sends them while the deployment runs, each the
# age ciphertext (raw bytes, decoded from the upload's base64) of one ``protocol.log_stream.ChunkPlaintext``:
# only ever ciphertext, never plaintext. Kept with the deployment's logs: deleted when the retention worker
# deletes its objects (``objects_deleted_at``), or with the deployment's row.
deployment_log_chunks = sa.Table(
    "deployment_log_chunks",
    metadata,
    sa.Column(
        "deployment_id", sa.Uuid(), sa.ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    ),
    # 1, 2, ... in the order the runner sent them.
    sa.Column("seq", sa.Integer(), primary_key=True),
    sa.Column("org_id", sa.String(50), nullable=False),
    # The phase the runner named in clear (X-Log-Phase): init, plan, apply, destroy, reporting.
    sa.Column("phase", sa.String(20), nullable=False),
    _ts("received_at"),
    # Bytes of ciphertext.
    sa.Column("size", sa.Integer(), nullable=False),
    sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
)

# A deployment's phases, in order (``position`` 1, 2, ...): queued and launching recorded by the orchestrator,
# the others when a runner's chunk names a phase other than the latest. Not secret.
deployment_phases = sa.Table(
    "deployment_phases",
    metadata,
    sa.Column(
        "deployment_id", sa.Uuid(), sa.ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("position", sa.Integer(), primary_key=True),
    sa.Column("org_id", sa.String(50), nullable=False),
    sa.Column("phase", sa.String(20), nullable=False),
    _ts("started_at"),
)

# Terraform state kept by the orchestrator itself (state storage type `orchestrator`): every version kept
# (the newest PO_STATE_VERSIONS_KEPT of each environment); the newest is the current state.
tf_states = sa.Table(
    "tf_states",
    metadata,
    sa.Column("env_uuid", sa.Uuid(), primary_key=True),
    sa.Column("version", sa.Integer(), primary_key=True),
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    # Sealed with the server key.
    sa.Column("data", sa.Text(), nullable=False),
    sa.Column("md5", sa.String(32), nullable=False),
    sa.Column("size", sa.Integer(), nullable=False),
    # The deployment whose Terraform wrote it (None for a rollback).
    sa.Column("deployment_id", sa.Uuid(), nullable=True),
    _ts("created_at"),
    # Read from the state document when written (migration 0013); NULL in rows written before, whose
    # values are read from the sealed document when they are answered.
    sa.Column("serial", sa.BigInteger(), nullable=True),
    sa.Column("lineage", sa.String(100), nullable=True),
    # Managed resource instances in the state.
    sa.Column("resources", sa.Integer(), nullable=True),
    # terraform (written through the state backend, or recovered from errored.tfstate) | rollback
    sa.Column("kind", sa.String(20), nullable=False, server_default="terraform"),
    # A rollback: the version whose content it made current again.
    sa.Column("rolled_back_from", sa.Integer(), nullable=True),
    # Who: the token id that created the deployment, or that asked for the rollback.
    sa.Column("created_by", sa.String(100), nullable=True),
)

tf_state_locks = sa.Table(
    "tf_state_locks",
    metadata,
    sa.Column("env_uuid", sa.Uuid(), primary_key=True),
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("lock_id", sa.String(200), nullable=False),
    sa.Column("info", JSONType, nullable=False),
    sa.Column("deployment_id", sa.Uuid(), nullable=True),
    _ts("created_at"),
)


# --- runner agents: commands, events, presence ----------------------------------------------------------

# Commands for agent runners (``create-job``), durable from the dispatch of their deployment until acked,
# rejected (dead letter), expired or cancelled. Delivered one at a time per runner, oldest first; a lease
# (``leased`` until ``available_at``) hides a delivered command until it is acked or the lease runs out.
agent_commands = sa.Table(
    "agent_commands",
    metadata,
    # create-job:<deployment id>:<revision>
    sa.Column("id", sa.String(300), primary_key=True),
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("runner_id", sa.String(64), nullable=False),
    sa.Column(
        "deployment_id", sa.Uuid(), sa.ForeignKey("deployments.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("type", sa.String(50), nullable=False),
    # The envelope as delivered, minus the deployment token (added on delivery; stored nowhere).
    sa.Column("envelope", JSONType, nullable=False),
    # pending | leased | acked | rejected | expired | cancelled
    sa.Column("state", sa.String(20), nullable=False),
    # Deliveries so far.
    sa.Column("attempt", sa.Integer(), nullable=False),
    # pending: deliverable from then on (retry delay); leased: the end of the lease.
    _ts("available_at"),
    _ts("expires_at"),
    _ts("created_at"),
    _ts("updated_at"),
    _ts("completed_at", nullable=True),
    sa.Column("reason", sa.String(4096), nullable=True),
    sa.Column("job_id", sa.String(300), nullable=True),
    _ts("job_created_at", nullable=True),
)
# Head of each runner's queue: its oldest open command.
sa.Index(
    "ix_agent_commands_queue",
    agent_commands.c.org_id,
    agent_commands.c.runner_id,
    agent_commands.c.created_at,
    sqlite_where=agent_commands.c.state.in_(["pending", "leased"]),
    postgresql_where=agent_commands.c.state.in_(["pending", "leased"]),
)
sa.Index("ix_agent_commands_state_available", agent_commands.c.state, agent_commands.c.available_at)
sa.Index("ix_agent_commands_state_expires", agent_commands.c.state, agent_commands.c.expires_at)
sa.Index("ix_agent_commands_deployment", agent_commands.c.deployment_id)

# Events of agents, applied exactly once: the row is written in the transaction that applies the event.
agent_event_inbox = sa.Table(
    "agent_event_inbox",
    metadata,
    sa.Column("org_id", sa.String(50), sa.ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("runner_id", sa.String(64), primary_key=True),
    sa.Column("event_id", sa.String(300), primary_key=True),
    sa.Column("type", sa.String(50), nullable=False),
    sa.Column("deployment_id", sa.Uuid(), nullable=False),
    _ts("received_at"),
)

# Agent tokens (JWTs) the gateway replicas accepted, until they expire: a replayed token is refused.
# ``digest`` is a SHA-256 of the token's ``jti`` (with org and runner), or of the whole token when it has
# no ``jti``. Written in batches by each replica and read by the others (``gateway.token_uses``).
agent_token_uses = sa.Table(
    "agent_token_uses",
    metadata,
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("replica", sa.String(64), nullable=False),
    _ts("first_used_at"),
    _ts("expires_at"),
    _ts("reusable_until", nullable=True),
)
sa.Index("ix_agent_token_uses_first_used", agent_token_uses.c.first_used_at)
sa.Index("ix_agent_token_uses_expires", agent_token_uses.c.expires_at)

# When an agent last asked for a command (written at most every few seconds per runner and replica).
agent_presence = sa.Table(
    "agent_presence",
    metadata,
    sa.Column("org_id", sa.String(50), primary_key=True),
    sa.Column("runner_id", sa.String(64), primary_key=True),
    _ts("last_seen_at"),
    sa.ForeignKeyConstraint(["org_id", "runner_id"], ["runners.org_id", "runners.id"], ondelete="CASCADE"),
)

# Key check values of the keys this database's sealed values are sealed under (never the keys): a server
# started with another key is refused at start. One row, id "server".
key_checks = sa.Table(
    "key_checks",
    metadata,
    sa.Column("id", sa.String(20), primary_key=True),
    sa.Column("check_value", sa.String(64), nullable=False),
    _ts("created_at"),
)

# The OIDC issuer's signing keys (``identity/``): every key here is published in the JWKS. ``generation``
# numbers them in order; its uniqueness makes replicas that create the next key at once agree on one. The
# private key is sealed with the server key (context ``signing-key:<kid>``), never stored in clear.
signing_keys = sa.Table(
    "signing_keys",
    metadata,
    sa.Column("kid", sa.String(64), primary_key=True),
    sa.Column("generation", sa.Integer(), nullable=False, unique=True),
    sa.Column("algorithm", sa.String(10), nullable=False),
    # The public key as a JWK (JSON text): what the JWKS publishes.
    sa.Column("public_jwk", sa.Text(), nullable=False),
    sa.Column("private_key_sealed", sa.Text(), nullable=False),
    _ts("created_at"),
    # From when it signs (published before, so that relying parties' cached JWKS already hold it).
    _ts("signs_from"),
)


# Managed runners (``po-runner managed``): the platform's own runners, one pool serving every organization
# (runner id ``managed`` in each). A record per runner name; a registration of the same name replaces it.
# The token is stored only as its SHA-256. The claim: the deployment the runner holds and until when
# (renewed by heartbeats), and when its deployment token was first used at the gateway.
managed_runners = sa.Table(
    "managed_runners",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.String(63), nullable=False, unique=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("tags", JSONType, nullable=False),
    _ts("registered_at"),
    _ts("last_seen_at"),
    sa.Column(
        "claim_deployment_id",
        sa.Uuid(),
        sa.ForeignKey("deployments.id", ondelete="SET NULL"),
        nullable=True,
        unique=True,
    ),
    _ts("claim_lease_until", nullable=True),
    _ts("claim_used_at", nullable=True),
)
sa.Index("ix_managed_runners_last_seen", managed_runners.c.last_seen_at)
sa.Index("ix_managed_runners_claim_lease", managed_runners.c.claim_lease_until)

#: Registration credentials a platform admin created (issue 26): a runner registering with one may serve at
#: most its tags. The secret is shown once and kept only as its SHA-256.
managed_runner_registrations = sa.Table(
    "managed_runner_registrations",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("tags", JSONType, nullable=False),
    sa.Column("description", sa.String(200), nullable=False),
    _ts("created_at"),
)
