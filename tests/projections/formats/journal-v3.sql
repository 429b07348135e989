-- a journal (schema version 3 in loomflow_meta), as loomflow wrote it at commit d09f49b (before one migration scheme):
-- SqliteRuntime ran Research(passes=1) in session s1 (no user) and s2 (user alice),
-- then the Auditor caught up and analytics.embedded.update ran; dumped with iterdump().
BEGIN TRANSACTION;
CREATE TABLE loomflow_checkpoints (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        checkpoint_id TEXT NOT NULL,
        base_seq INTEGER NOT NULL,
        turn INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        usage TEXT NOT NULL,
        cursor TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (user_id, session_id, seq)
    ) WITHOUT ROWID;
INSERT INTO "loomflow_checkpoints" VALUES('','s1',8,'ckpt01m8xkzh5p9xazksjyq5wghs9v',0,3,7,'{"input_tokens":63,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":23,"cost_usd":0.000534}','pass:1','2026-12-03T09:32:44.598819+00:00');
INSERT INTO "loomflow_checkpoints" VALUES('alice','s2',8,'ckpt01m8xkzh5wa2rej1rvxfcdzpeg',0,3,7,'{"input_tokens":63,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":23,"cost_usd":0.000534}','pass:1','2026-12-03T09:32:44.604572+00:00');
CREATE TABLE "loomflow_events" (
        position INTEGER PRIMARY KEY AUTOINCREMENT,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        type TEXT NOT NULL,
        event_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        epoch INTEGER NOT NULL,
        v INTEGER NOT NULL,
        at TEXT NOT NULL,
        payload TEXT NOT NULL
    );
INSERT INTO "loomflow_events" VALUES(1,'','s1',1,'run.started','evt01m8xkzh5g8jvfvxqvwj45k6hg','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.592166+00:00','{"options":{},"model":"scripted","agent":"agent","lease_seconds":30.0}');
INSERT INTO "loomflow_events" VALUES(2,'','s1',2,'turn.appended','evt01m8xkzh5j0pchkxgb2t5nc5m9','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.594916+00:00','{"messages":[{"role":"system","content":"You are a careful researcher."},{"role":"user","content":"research"}]}');
INSERT INTO "loomflow_events" VALUES(3,'','s1',3,'turn.appended','evt01m8xkzh5kd0spjey3yce3grgs','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.595995+00:00','{"messages":[{"role":"assistant","tool_calls":[{"id":"call_0_0","name":"lookup","arguments":{"topic":"kafka"}}]}],"usage":{"input_tokens":10,"output_tokens":7,"cost_usd":0.000135},"model_call":true,"step_key":"model:1","input_hash":"4218debcd368df8a57846fe16f44a78a","model":"scripted","latency_ms":0.06}');
INSERT INTO "loomflow_events" VALUES(4,'','s1',4,'turn.appended','evt01m8xkzh5m2b625eaj0h7jcb2v','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.596926+00:00','{"messages":[{"role":"tool","content":"a distributed log","tool_call_id":"call_0_0"}],"step_key":"tool:call_0_0","input_hash":"83fe157a6c4cf5b2cca791288cc0c14d"}');
INSERT INTO "loomflow_events" VALUES(5,'','s1',5,'turn.appended','evt01m8xkzh5n50s1byzxj2hzf0ce','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.597212+00:00','{"messages":[{"role":"assistant","tool_calls":[{"id":"call_1_0","name":"note","arguments":{"text":"kafka noted"}}]}],"usage":{"input_tokens":20,"output_tokens":7,"cost_usd":0.000165},"model_call":true,"step_key":"model:2","input_hash":"263f4fc6165e24d9f6ebc43f50eead34","model":"scripted","latency_ms":0.048}');
INSERT INTO "loomflow_events" VALUES(6,'','s1',6,'turn.appended','evt01m8xkzh5n50s1byzxj2hzf0cf','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.597722+00:00','{"messages":[{"role":"tool","content":"{\"saved\":\"kafka noted\"}","tool_call_id":"call_1_0"}],"step_key":"tool:call_1_0","input_hash":"04b1c7a8bec3e53a0da849eab3891444"}');
INSERT INTO "loomflow_events" VALUES(7,'','s1',7,'turn.appended','evt01m8xkzh5n50s1byzxj2hzf0cg','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.597950+00:00','{"messages":[{"role":"assistant","content":"Pass 1: kafka is a distributed log."}],"usage":{"input_tokens":33,"output_tokens":9,"cost_usd":0.000234},"model_call":true,"step_key":"model:3","input_hash":"4a1d9b8c01fb11c262c9c1a5ce28c1b4","model":"scripted","latency_ms":0.032}');
INSERT INTO "loomflow_events" VALUES(8,'','s1',8,'checkpoint.written','evt01m8xkzh5p9xazksjyq5wghs9w','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.598819+00:00','{"checkpoint_id":"ckpt01m8xkzh5p9xazksjyq5wghs9v","turn":3,"cumulative_usage":{"input_tokens":63,"output_tokens":23,"cost_usd":0.000534},"cursor":"pass:1","message_count":7,"retain":20}');
INSERT INTO "loomflow_events" VALUES(9,'','s1',9,'run.finished','evt01m8xkzh5qff9gd4yh7nqdjcmn','run01m8xkzh59a1yzsetg8xvfpxxm',1,1,'2026-12-03T09:32:44.599343+00:00','{"output":"Pass 1: kafka is a distributed log.","turns":3,"usage":{"input_tokens":63,"output_tokens":23,"cost_usd":0.000534},"model":"scripted"}');
INSERT INTO "loomflow_events" VALUES(10,'alice','s2',1,'run.started','evt01m8xkzh5s0s0dffsh85vezrkk','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.601712+00:00','{"options":{},"model":"scripted","agent":"agent","lease_seconds":30.0}');
INSERT INTO "loomflow_events" VALUES(11,'alice','s2',2,'turn.appended','evt01m8xkzh5t609gb2xy68k7hkvx','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.602236+00:00','{"messages":[{"role":"system","content":"You are a careful researcher."},{"role":"user","content":"research"}]}');
INSERT INTO "loomflow_events" VALUES(12,'alice','s2',3,'turn.appended','evt01m8xkzh5t609gb2xy68k7hkvy','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.602894+00:00','{"messages":[{"role":"assistant","tool_calls":[{"id":"call_0_0","name":"lookup","arguments":{"topic":"kafka"}}]}],"usage":{"input_tokens":10,"output_tokens":7,"cost_usd":0.000135},"model_call":true,"step_key":"model:1","input_hash":"4218debcd368df8a57846fe16f44a78a","model":"scripted","latency_ms":0.041}');
INSERT INTO "loomflow_events" VALUES(13,'alice','s2',4,'turn.appended','evt01m8xkzh5v4z58nb3evx2394w4','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.603405+00:00','{"messages":[{"role":"tool","content":"a distributed log","tool_call_id":"call_0_0"}],"step_key":"tool:call_0_0","input_hash":"83fe157a6c4cf5b2cca791288cc0c14d"}');
INSERT INTO "loomflow_events" VALUES(14,'alice','s2',5,'turn.appended','evt01m8xkzh5v4z58nb3evx2394w5','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.603652+00:00','{"messages":[{"role":"assistant","tool_calls":[{"id":"call_1_0","name":"note","arguments":{"text":"kafka noted"}}]}],"usage":{"input_tokens":20,"output_tokens":7,"cost_usd":0.000165},"model_call":true,"step_key":"model:2","input_hash":"263f4fc6165e24d9f6ebc43f50eead34","model":"scripted","latency_ms":0.045}');
INSERT INTO "loomflow_events" VALUES(15,'alice','s2',6,'turn.appended','evt01m8xkzh5wa2rej1rvxfcdzpee','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.604170+00:00','{"messages":[{"role":"tool","content":"{\"saved\":\"kafka noted\"}","tool_call_id":"call_1_0"}],"step_key":"tool:call_1_0","input_hash":"04b1c7a8bec3e53a0da849eab3891444"}');
INSERT INTO "loomflow_events" VALUES(16,'alice','s2',7,'turn.appended','evt01m8xkzh5wa2rej1rvxfcdzpef','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.604400+00:00','{"messages":[{"role":"assistant","content":"Pass 1: kafka is a distributed log."}],"usage":{"input_tokens":33,"output_tokens":9,"cost_usd":0.000234},"model_call":true,"step_key":"model:3","input_hash":"4a1d9b8c01fb11c262c9c1a5ce28c1b4","model":"scripted","latency_ms":0.03}');
INSERT INTO "loomflow_events" VALUES(17,'alice','s2',8,'checkpoint.written','evt01m8xkzh5wa2rej1rvxfcdzpeh','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.604572+00:00','{"checkpoint_id":"ckpt01m8xkzh5wa2rej1rvxfcdzpeg","turn":3,"cumulative_usage":{"input_tokens":63,"output_tokens":23,"cost_usd":0.000534},"cursor":"pass:1","message_count":7,"retain":20}');
INSERT INTO "loomflow_events" VALUES(18,'alice','s2',9,'run.finished','evt01m8xkzh5wa2rej1rvxfcdzpej','run01m8xkzh5s0s0dffsh85vezrkj',1,1,'2026-12-03T09:32:44.604686+00:00','{"output":"Pass 1: kafka is a distributed log.","turns":3,"usage":{"input_tokens":63,"output_tokens":23,"cost_usd":0.000534},"model":"scripted"}');
CREATE TABLE loomflow_log_notes (
        position INTEGER PRIMARY KEY,
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        through_seq INTEGER NOT NULL,
        seqs TEXT,
        at TEXT NOT NULL
    );
CREATE TABLE loomflow_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "loomflow_meta" VALUES('schema_version','3');
CREATE TABLE loomflow_sessions (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        status TEXT NOT NULL,
        last_seq INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        turns INTEGER NOT NULL,
        usage TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        base_seq INTEGER NOT NULL,
        parent_session_id TEXT,
        parent_checkpoint_id TEXT,
        last_run_id TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL, control TEXT,
        PRIMARY KEY (user_id, session_id)
    ) WITHOUT ROWID;
INSERT INTO "loomflow_sessions" VALUES('','s1','finished',9,1,3,'{"input_tokens":63,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":23,"cost_usd":0.000534}',7,0,NULL,NULL,'run01m8xkzh59a1yzsetg8xvfpxxm','2026-12-03T09:32:44.592166+00:00','2026-12-03T09:32:44.599343+00:00','{"agent":"agent","lease":30.0,"metadata":{},"options":{},"calls":3,"spent":{"input_tokens":63,"output_tokens":23,"cost_usd":0.000534}}');
INSERT INTO "loomflow_sessions" VALUES('alice','s2','finished',9,1,3,'{"input_tokens":63,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":23,"cost_usd":0.000534}',7,0,NULL,NULL,'run01m8xkzh5s0s0dffsh85vezrkj','2026-12-03T09:32:44.601712+00:00','2026-12-03T09:32:44.604686+00:00','{"agent":"agent","lease":30.0,"metadata":{},"options":{},"calls":3,"spent":{"input_tokens":63,"output_tokens":23,"cost_usd":0.000534}}');
CREATE TABLE loomflow_steps (
        user_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        step_key TEXT NOT NULL,
        input_hash TEXT NOT NULL,
        seq INTEGER NOT NULL,
        value TEXT NOT NULL,
        serializer TEXT NOT NULL,
        at TEXT NOT NULL,
        PRIMARY KEY (user_id, session_id, step_key)
    ) WITHOUT ROWID;
CREATE INDEX loomflow_sessions_updated ON loomflow_sessions (updated_at);
CREATE UNIQUE INDEX loomflow_checkpoints_id
        ON loomflow_checkpoints (user_id, session_id, checkpoint_id);
CREATE UNIQUE INDEX loomflow_events_scope ON loomflow_events (user_id, session_id, seq);
CREATE INDEX loomflow_sessions_user_updated ON loomflow_sessions (user_id, updated_at);
CREATE INDEX loomflow_sessions_parent ON loomflow_sessions (user_id, parent_session_id)
        WHERE parent_session_id IS NOT NULL;
CREATE INDEX loomflow_sessions_in_flight ON loomflow_sessions (status)
        WHERE status IN ('running', 'waiting', 'signalled');
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('loomflow_events',18);
COMMIT;
