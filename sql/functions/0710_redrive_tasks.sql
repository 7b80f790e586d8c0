-- Moves up to p_batch dead letters of task (p_dlq, p_id) back to their origins and
-- counts them in the task, in one transaction. Returns the number moved, or NULL when
-- the task is no longer open (done, failed, canceled). Finishes the task when the
-- queue ran dry or max_messages was reached.
CREATE OR REPLACE FUNCTION streamd.redrive_task_step(p_dlq text, p_id bigint, p_batch integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_task  streamd.redrive_tasks%ROWTYPE;
    v_batch integer;
    v_moved integer;
BEGIN
    SELECT * INTO v_task FROM streamd.redrive_tasks
     WHERE dlq = p_dlq AND id = p_id AND status IN ('pending', 'running') FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_batch := p_batch;
    IF v_task.max_messages > 0 THEN
        v_batch := least(v_batch, v_task.max_messages - v_task.moved);
    END IF;
    v_moved := 0;
    IF v_batch > 0 THEN
        v_moved := streamd.queue_redrive(p_dlq, v_batch, NULL);
    END IF;
    UPDATE streamd.redrive_tasks
       SET moved = moved + v_moved, updated_at = now(),
           status = CASE WHEN v_moved < v_batch OR v_batch <= 0 THEN 'done' ELSE 'running' END,
           finished_at = CASE WHEN v_moved < v_batch OR v_batch <= 0 THEN now() END
     WHERE dlq = p_dlq AND id = p_id;
    RETURN v_moved;
END;
$$;
