"""Policy over the store: every state change that is more than one row's CRUD."""
