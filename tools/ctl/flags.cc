// The flags of taskgridctl (see flags.h). Each says which commands take
// it; the command line checks that a flag given applies to its command.
#include "tools/ctl/flags.h"

#include "absl/flags/flag.h"

// Global.
ABSL_FLAG(std::string, addr, "",
          "HOST:PORT of taskgrid-scheduler, or a comma-separated list of a leader and its "
          "standbys: each call goes to whichever leads (default: $TASKGRID_ADDR, else "
          "127.0.0.1:7070)");
ABSL_FLAG(bool, json, false,
          "Print the API's answer as proto3 JSON (snake_case names, every field)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30),
          "Deadline of each call to the scheduler; wait, watch --follow and logs -f keep "
          "trying a scheduler they lost for this long");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that signed the scheduler's certificate: connect with TLS "
          "(default: $TASKGRID_TLS_CA)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for a scheduler that requires one (with --tls_key; "
          "default: $TASKGRID_TLS_CERT)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (default: $TASKGRID_TLS_KEY)");
ABSL_FLAG(std::string, token_file, "",
          "File holding a bearer token, for a scheduler with --tokens_file; needs --tls_ca "
          "(default: $TASKGRID_TOKEN_FILE)");

// submit.
ABSL_FLAG(std::string, file, "", "submit: JSON file of tasks ('-' = stdin); also -f FILE");
ABSL_FLAG(std::string, builtin, "", "submit: run this builtin (noop, sleep, fail, echo)");
ABSL_FLAG(std::string, id, "",
          "submit: task id (default: generated); job submit: job id (overrides the file's); "
          "watch: only these task ids, a,b");
ABSL_FLAG(std::string, queue, "", "submit, list, stats, watch: queue name");
ABSL_FLAG(int32_t, priority, 0, "submit: higher runs first");
ABSL_FLAG(int32_t, max_attempts, 0, "submit: attempts before FAILED (0: scheduler default)");
ABSL_FLAG(std::string, not_before, "", "submit: RFC 3339 time, or +DURATION from now");
ABSL_FLAG(std::string, payload, "", "submit: standard input of the task");
ABSL_FLAG(std::string, payload_file, "", "submit: read the payload from this file ('-' = stdin)");
ABSL_FLAG(std::string, env, "", "submit: K=V,K2=V2 added to the program's environment");
ABSL_FLAG(std::string, cwd, "", "submit: working directory of the program");
ABSL_FLAG(absl::Duration, step_timeout, absl::ZeroDuration(), "submit: kill the step after this");
ABSL_FLAG(absl::Duration, attempt_timeout, absl::ZeroDuration(), "submit: limit of one attempt");
ABSL_FLAG(absl::Duration, ack_timeout, absl::ZeroDuration(),
          "submit: dispatch -> agent accepts (0: scheduler default)");
ABSL_FLAG(absl::Duration, schedule_timeout, absl::ZeroDuration(),
          "submit: FAILED if no agent started it within this of the submit (0: no limit)");
ABSL_FLAG(std::string, labels, "", "submit: k=v,... labels the agent must carry");
ABSL_FLAG(std::string, task_labels, "",
          "submit: k=v,... the task's own labels, to find it by; list: only tasks carrying these");
ABSL_FLAG(std::string, agents, "", "submit: a1,a2: only these agents may run the task");
ABSL_FLAG(int32_t, slots, 0, "submit: slots the task occupies (0: 1)");
ABSL_FLAG(std::string, resources, "",
          "submit: cpu=2,memory=4GiB,gpu=1: what the task needs free on its agent");
ABSL_FLAG(std::string, merge_key, "",
          "submit: join the waiting task of this key (its payload appended); delete: the key");
ABSL_FLAG(std::string, merge_update, "",
          "submit --merge_key: always (default: each submit moves the fire time) or once");
ABSL_FLAG(int32_t, replicas, 0,
          "submit: run the task on N agents at once, one replica task each (0: no replicas)");
ABSL_FLAG(std::string, replica_agents, "",
          "submit: a1,a2,...: one replica on each of these agents (replica i on the i-th)");
ABSL_FLAG(std::string, success, "",
          "submit --replicas: when the task succeeded: all (default), any or quorum:K");
ABSL_FLAG(bool, gang, false,
          "submit --replicas: the replicas start together or not at all, each on its own agent");
ABSL_FLAG(absl::Duration, gang_wait, absl::ZeroDuration(),
          "submit --gang: how long room is reserved for the gang while it waits (default 5m, "
          "at most 24h)");
ABSL_FLAG(std::string, unique_key, "",
          "submit: unique by this key in its queue for --unique_ttl: a second submit with it "
          "returns the first task");
ABSL_FLAG(absl::Duration, unique_ttl, absl::ZeroDuration(),
          "submit --unique_key: how long the key is held, from --not_before or the submit "
          "(1s to 720h)");
ABSL_FLAG(bool, unique_keep, false,
          "submit --unique_key: hold the key for the whole --unique_ttl, even once the task "
          "succeeded or was cancelled");
ABSL_FLAG(bool, unique_refuse, false,
          "submit --unique_key: fail with ALREADY_EXISTS naming the holder when the key is held, "
          "instead of returning the holder");
ABSL_FLAG(int32_t, max_concurrency, 0,
          "queue limits: most tasks of the queue dispatched or running at once (0: no limit)");
ABSL_FLAG(double, rate, 0, "queue limits: most task starts per second (0: no limit)");
ABSL_FLAG(int32_t, burst, 0, "queue limits --rate: starts allowed at once (0: max(1, rate))");
ABSL_FLAG(int32_t, weight, 1,
          "queue weight: the queue's share against the other queues with work, 0-10000 (0: "
          "only when no other waits); left out: the queue has no weight of its own");
ABSL_FLAG(std::string, quota, "",
          "queue limits: cpu=64,gpu=4: most of each resource the queue's tasks hold at once");
ABSL_FLAG(int32_t, limit, 0,
          "cancel, retry, delete --queue/--job: tasks per call, 1-10000 (0: 1000)");
ABSL_FLAG(absl::Duration, retention, absl::ZeroDuration(),
          "queue retention: keep SUCCEEDED and CANCELLED tasks this long (0s: until deleted)");
ABSL_FLAG(absl::Duration, failed_retention, absl::ZeroDuration(),
          "queue retention: keep FAILED and TRASHED tasks this long (0s: until deleted)");
ABSL_FLAG(bool, wait, false,
          "submit: then wait until every task finished (exit code as wait); job submit: until "
          "the job finished");

// schedule create.
ABSL_FLAG(std::string, cron, "",
          "schedule create: fire on this cron expression (5 fields, or @hourly, @daily, ...)");
ABSL_FLAG(absl::Duration, every, absl::ZeroDuration(),
          "schedule create: fire every DURATION (whole seconds, at least 1s)");
ABSL_FLAG(std::string, tz, "", "schedule create: IANA time zone of --cron (default UTC)");
ABSL_FLAG(std::string, misfire, "",
          "schedule create: catch_up (default), skip or run_once: what fires missed while the "
          "scheduler was down do");
ABSL_FLAG(bool, paused, false, "schedule create: create it paused");

// wait, submit --wait.
ABSL_FLAG(absl::Duration, wait_timeout, absl::InfiniteDuration(),
          "wait, submit --wait, job submit --wait: give up after this long, exit 4 (default: no "
          "limit)");

// list.
ABSL_FLAG(std::string, state, "",
          "list, watch: only these states, e.g. pending,failed; job list: only jobs in these "
          "states, e.g. running,failed");
ABSL_FLAG(int32_t, page_size, 0, "list, job list: tasks (jobs) per page, 1-1000 (0: 100)");
ABSL_FLAG(std::string, page_token, "", "list, job list: continue from a previous 'more:' token");
ABSL_FLAG(bool, all, false, "list, job list: follow every page");
ABSL_FLAG(std::string, job, "", "list, watch: only the tasks of this job");
ABSL_FLAG(std::string, id_prefix, "", "list: only the tasks whose id starts with this");
ABSL_FLAG(bool, newest_first, false, "list: newest first (pass it with --page_token too)");

// watch.
ABSL_FLAG(int64_t, after, 0,
          "watch: first replay the kept changes after this revision (0: all of them)");
ABSL_FLAG(int64_t, count, 0, "watch: exit after this many events (0: no limit)");
ABSL_FLAG(bool, follow, false,
          "watch: reconnect by itself when the stream ends; logs (also -f): follow the output "
          "until the task is finished");

// logs.
ABSL_FLAG(std::string, stream, "", "logs: only stdout or stderr (also --stdout, --stderr)");

// board (pull mode).
ABSL_FLAG(std::string, owner, "", "board: who claims (the worker's name)");
ABSL_FLAG(absl::Duration, lease, absl::ZeroDuration(),
          "board claim, extend: how long the claim holds (0: the scheduler's default, 60s)");
ABSL_FLAG(int32_t, max, 1, "board claim: at most this many tasks");
ABSL_FLAG(int32_t, exit_code, 0, "board complete: the exit code (0: SUCCEEDED, else FAILED)");
ABSL_FLAG(std::string, stdout, "", "board complete: the output to keep as stdout");
ABSL_FLAG(std::string, error, "", "board complete: why it failed");
ABSL_FLAG(std::string, reason, "", "board abandon, trash: why");
