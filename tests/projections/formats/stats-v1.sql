-- its stats database (version 1 in stats_meta), as loomflow wrote it at commit d09f49b (before one migration scheme):
-- SqliteRuntime ran Research(passes=1) in session s1 (no user) and s2 (user alice),
-- then the Auditor caught up and analytics.embedded.update ran; dumped with iterdump().
BEGIN TRANSACTION;
CREATE TABLE stats_hourly (
    hour TEXT NOT NULL,
    model TEXT NOT NULL,
    user_id TEXT NOT NULL,
    runs_started INTEGER NOT NULL, runs_finished INTEGER NOT NULL, runs_failed INTEGER NOT NULL, turns INTEGER NOT NULL, model_calls INTEGER NOT NULL, input_tokens INTEGER NOT NULL, cached_input_tokens INTEGER NOT NULL, cache_write_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL, latency_ms_total REAL NOT NULL,
    latency TEXT NOT NULL,
    tools TEXT NOT NULL,
    PRIMARY KEY (hour, model, user_id)
) WITHOUT ROWID;
INSERT INTO "stats_hourly" VALUES('2026-12-03T09:00Z','scripted','(none)',1,1,0,3,3,63,0,0,23,0.000534,0.14,'{"0":3}','{"lookup":1,"note":1}');
INSERT INTO "stats_hourly" VALUES('2026-12-03T09:00Z','scripted','alice',1,1,0,3,3,63,0,0,23,0.000534,0.116,'{"0":3}','{"lookup":1,"note":1}');
CREATE TABLE stats_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "stats_meta" VALUES('schema_version','1');
CREATE TABLE stats_positions (
    partition INTEGER PRIMARY KEY,
    next_offset INTEGER NOT NULL
);
INSERT INTO "stats_positions" VALUES(0,19);
CREATE TABLE stats_sessions (
    user_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    erased INTEGER NOT NULL,
    totals TEXT,
    PRIMARY KEY (user_id, session_id)
) WITHOUT ROWID;
INSERT INTO "stats_sessions" VALUES('','s1',9,1,0,'{"user":"(none)","session_id":"s1","first_at":"2026-12-03T09:32:44.592166+00:00","last_at":"2026-12-03T09:32:44.599343+00:00","counters":{"runs_started":1,"runs_finished":1,"runs_failed":0,"turns":3,"model_calls":3,"input_tokens":63,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":23,"cost_usd":0.000534,"latency_ms_total":0.14,"latency":{"0":3},"tools":{"lookup":1,"note":1}}}');
INSERT INTO "stats_sessions" VALUES('alice','s2',9,1,0,'{"user":"alice","session_id":"s2","first_at":"2026-12-03T09:32:44.601712+00:00","last_at":"2026-12-03T09:32:44.604686+00:00","counters":{"runs_started":1,"runs_finished":1,"runs_failed":0,"turns":3,"model_calls":3,"input_tokens":63,"cached_input_tokens":0,"cache_write_tokens":0,"output_tokens":23,"cost_usd":0.000534,"latency_ms_total":0.116,"latency":{"0":3},"tools":{"lookup":1,"note":1}}}');
CREATE TABLE stats_skipped (
    position TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    reason TEXT NOT NULL,
    at TEXT NOT NULL
) WITHOUT ROWID;
COMMIT;
