-- cg_raise_fenced now names the reason of a fencing (SD108 session expired, SD109
-- partition moved, SD110 stale epoch) and takes the partition and the time; its old
-- five-argument form (a detail text, SD101) is gone. Dropped here, not by a line kept
-- in the functions file (sql/doc: a signature change is a migration).
DROP FUNCTION IF EXISTS streamd.cg_raise_fenced(text, text, text, bigint, text);
