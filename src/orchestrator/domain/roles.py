"""Roles of API tokens and what each may do."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    PLATFORM_ADMIN = "platform-admin"
    ADMIN = "admin"
    DEPLOYER = "deployer"
    VIEWER = "viewer"


class Permission(StrEnum):
    #: Read anything of the organization except its tokens.
    READ = "read"
    #: Start deployments; create and delete environments.
    DEPLOY = "deploy"
    #: Manage runners, rules, projects, environment types, modules, tokens; refresh_runner.
    MANAGE = "manage"


#: Roles an organization token may have (platform-admin is only for platform-wide tokens).
ORG_ROLES = (Role.ADMIN, Role.DEPLOYER, Role.VIEWER)

_GRANTS: dict[Role, frozenset[Permission]] = {
    Role.PLATFORM_ADMIN: frozenset(Permission),
    Role.ADMIN: frozenset(Permission),
    Role.DEPLOYER: frozenset({Permission.READ, Permission.DEPLOY}),
    Role.VIEWER: frozenset({Permission.READ}),
}


def allows(role: Role, permission: Permission) -> bool:
    return permission in _GRANTS[role]
