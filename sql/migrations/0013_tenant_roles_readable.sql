-- Every role may read its own tenant binding (and only its own: the row-level policy
-- tenant_roles_own). The tenant policies on events and messages call
-- streamd.current_tenant(), which reads streamd.tenant_roles with the caller's rights;
-- only tenant roles had SELECT on it, so any other role that is not the owner (a
-- reporting role granted SELECT on streamd.events, say) failed with "permission denied
-- for table tenant_roles" instead of passing the policies as documented.
GRANT SELECT ON streamd.tenant_roles TO PUBLIC;
