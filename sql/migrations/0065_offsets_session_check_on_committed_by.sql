-- The check at COMMIT of a member's offsets (migration 0016, issue 16) fired for rows
-- whose consumer_id was set; since migration 0060 the committing member is
-- committed_by (consumer_id is seed 003's consumer name, NULL for the library's
-- commits), so the trigger is made again on committed_by: without this it would
-- never fire and a frozen member's CommitTx transaction would commit when it wakes.
DROP TRIGGER IF EXISTS consumer_offsets_session_check ON streamd.consumer_offsets;
CREATE CONSTRAINT TRIGGER consumer_offsets_session_check
    AFTER INSERT OR UPDATE ON streamd.consumer_offsets
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.committed_by IS NOT NULL)
    EXECUTE FUNCTION streamd.cg_offsets_check_session();
