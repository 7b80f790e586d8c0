-- lifecycle_config.readOnly acts (issue 20, point 3): the stream refuses appends.
-- The flag is mirrored onto the stream's row, which every append path reads already
-- (so it costs them one boolean test), by the trigger stream_configurations_lifecycle
-- (sql/functions/0420_stream_settings.sql).
ALTER TABLE streamd.streams ADD COLUMN read_only boolean NOT NULL DEFAULT false;
UPDATE streamd.streams s SET read_only = true
  FROM streamd.stream_configurations c
 WHERE c.stream_name = s.stream_name AND jsonb_typeof(c.lifecycle_config -> 'readOnly') = 'boolean'
   AND (c.lifecycle_config ->> 'readOnly')::boolean;
