-- cg_drop_member gained p_wait (issue 16: departures skip the rows an in-flight
-- commit holds instead of waiting for them); its four-argument form goes.
DROP FUNCTION IF EXISTS streamd.cg_drop_member(text, text, text, timestamptz);
