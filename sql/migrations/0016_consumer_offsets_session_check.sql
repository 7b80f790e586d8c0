-- A member's offset commits are checked again at COMMIT (issue 16): the member must
-- still be registered at its epoch with a live session, else the transaction is
-- refused (SD101). A handler's CommitTx transaction that stayed open while its member
-- was expired (a frozen process) no longer commits when it wakes. The check is
-- streamd.cg_offsets_check_session (sql/functions/0200_consumer_groups.sql, which
-- replaces this placeholder body on every migrate; a constraint trigger cannot be
-- CREATE OR REPLACEd, so the trigger itself lives here).
CREATE OR REPLACE FUNCTION streamd.cg_offsets_check_session() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER consumer_offsets_session_check
    AFTER INSERT OR UPDATE ON streamd.consumer_offsets
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.consumer_id IS NOT NULL)
    EXECUTE FUNCTION streamd.cg_offsets_check_session();
