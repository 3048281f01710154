//! Every operator-facing code, declared once: what it means and what to
//! do about it.
//!
//! A code (`NODE-AREA-NNN`) opens each error message, refusal and warning
//! an operator may see, so that a log line can be looked up. The table
//! here is the only place a code is defined; `docs/codes.md` is rendered
//! from it ([`markdown`]), and this module's tests fail on a code written
//! anywhere in the workspace that is not registered, on a registered code
//! raised in a file its entry does not name (one code, one meaning), and
//! on a `docs/codes.md` that differs from the table.
//!
//! ```
//! use flotilla_proto::codes;
//!
//! let code = codes::lookup("NODE-JOB-009").unwrap();
//! assert!(code.meaning.contains("outside the roots"));
//! assert!(codes::lookup("NODE-JOB-999").is_none());
//! ```

/// One operator-facing code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// The code, `NODE-AREA-NNN`.
    pub id: &'static str,
    /// What happened.
    pub meaning: &'static str,
    /// What the operator does about it.
    pub fix: &'static str,
    /// The source files (from the workspace root) that raise it: a code
    /// raised elsewhere is a second meaning, and refused by the tests.
    pub raised_in: &'static [&'static str],
}

const fn code(
    id: &'static str,
    meaning: &'static str,
    fix: &'static str,
    raised_in: &'static [&'static str],
) -> Code {
    Code {
        id,
        meaning,
        fix,
        raised_in,
    }
}

/// Every code, sorted by area and number.
pub const CODES: &[Code] = &[
    code(
        "NODE-AUTH-001",
        "A connection was refused at the TLS handshake (unknown CA, expired or revoked certificate, no node name)",
        "Issue a certificate from this cluster's CA (`node certs issue`), or renew it (`node certs renew`)",
        &["framework/transport/src/endpoint.rs"],
    ),
    code(
        "NODE-AUTH-002",
        "Claimed node name differs from the certificate's name",
        "Issue a certificate for this name with `node certs issue`",
        &[
            "framework/proto/src/hello.rs",
            "framework/runtime/src/net/sessions.rs",
        ],
    ),
    code(
        "NODE-AUTH-003",
        "A peer's certificate carries no node name",
        "Issue its certificate with `node certs issue`",
        &[
            "framework/transport/src/closing.rs",
            "framework/transport/src/endpoint.rs",
        ],
    ),
    code(
        "NODE-AUTH-004",
        "The admin certificate joins only as a driver that offers no resources",
        "Issue a node certificate with `node certs issue`",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-AUTH-005",
        "The cluster cookie differs",
        "Give every node the `cookie` file that `node certs init` wrote into the certs folder",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-AUTH-006",
        "This incarnation of the node is no longer a member (down, left or replaced)",
        "It must rejoin",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-AUTH-007",
        "Incarnation 0 opens control streams only",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-AUTH-008",
        "Only the node itself tells its spawner who is up",
        "A member table from another node is refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-009",
        "Only the node that spawned an actor, or the head, may stop it",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &[
            "framework/proto/src/authority.rs",
            "framework/proto/src/control.rs",
        ],
    ),
    code(
        "NODE-AUTH-010",
        "A certificate of this role may not make this request",
        "Issue one with the right --role (node certs issue)",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-011",
        "Only the member that created a placement group, an admin or the head may remove it",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-012",
        "Only the head may change a node's reservations",
        "Nothing to do: the request came from a member that may not make it, and was counted",
        &[
            "framework/proto/src/authority.rs",
            "framework/proto/src/ledger.rs",
        ],
    ),
    code(
        "NODE-AUTH-013",
        "Only the certificate that submitted a job, an admin or the head may stop it",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-014",
        "Only the member an object was lent to may release it",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-015",
        "The object reference does not carry the object's token",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-016",
        "Only up members open cluster, bulk and pull streams",
        "Join the cluster first",
        &[
            "framework/proto/src/authority.rs",
            "framework/proto/src/hello.rs",
        ],
    ),
    code(
        "NODE-AUTH-017",
        "A reported placement group that the head neither knows nor created is not adopted",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-018",
        "The certificate carries no role",
        "Issue a new one with `node certs issue --role …`",
        &[
            "framework/proto/src/hello.rs",
            "framework/runtime/src/control/query_error.rs",
            "framework/runtime/src/node/builder.rs",
        ],
    ),
    code(
        "NODE-AUTH-019",
        "An observer certificate queries the cluster",
        "It cannot join it",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-AUTH-020",
        "This certificate has been revoked",
        "Issue a new one with `node certs issue`",
        &[
            "framework/proto/src/hello.rs",
            "framework/runtime/src/net/gate.rs",
            "framework/transport/src/closing.rs",
        ],
    ),
    code(
        "NODE-AUTH-021",
        "The peer at … is … with role …, not …",
        "Check --head (and --head-name)",
        &[
            "framework/transport/src/closing.rs",
            "framework/transport/src/endpoint.rs",
        ],
    ),
    code(
        "NODE-AUTH-022",
        "A node started as the head holds a certificate of another role",
        "Start the head with the head's certificate (`node certs init` issues it)",
        &["framework/runtime/src/node/builder.rs"],
    ),
    code(
        "NODE-AUTH-023",
        "The peer closed the connection: this member incarnation is no longer up",
        "Join again",
        &[
            "framework/runtime/src/net/gate.rs",
            "framework/transport/src/closing.rs",
        ],
    ),
    code(
        "NODE-AUTH-024",
        "Only the head may spawn this kind: it acts with the rights the head grants (a detached job's driver)",
        "Submit a job instead (`node embed --detach`)",
        &[
            "framework/proto/src/authority.rs",
            "framework/runtime/src/node/builder.rs",
        ],
    ),
    code(
        "NODE-AUTH-025",
        "A reported placement bundle that the head's record does not give this node is not adopted",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-026",
        "Only the head's detached-job service creates detached placement groups",
        "Submit a detached job instead",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-027",
        "Closing the connection of a certificate that expired while it was open",
        "Renew it (node certs renew)",
        &[
            "framework/runtime/src/net/gate.rs",
            "framework/transport/src/closing.rs",
        ],
    ),
    code(
        "NODE-AUTH-028",
        "The revocations are in force but not stored: a restart without the list would not know them",
        "Use a certificate of the role that may make the request (`node certs issue --role …`); the refusal is counted on the node that refused",
        &["framework/runtime/src/head/mod.rs"],
    ),
    code(
        "NODE-AUTH-029",
        "The peer closed the connection: this certificate holds as many connections to it as it may",
        "Close some",
        &[
            "framework/runtime/src/net/quota.rs",
            "framework/transport/src/closing.rs",
        ],
    ),
    code(
        "NODE-AUTH-030",
        "A cluster frame from a peer was dropped: it names more actors, group memberships or open calls than its certificate may make this node hold, a call without a timeout (or past 10 minutes), or does not read as one message; the session goes on",
        "Announce fewer actors, keep fewer calls open, give every call a timeout; see docs/security.md, Bounds",
        &["framework/proto/src/cluster_frames.rs"],
    ),
    code(
        "NODE-AUTH-031",
        "A worker may drain only itself (or another process of its pool); draining another member takes an admin's certificate",
        "Drain with an admin's certificate (`node certs issue --role admin`)",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-AUTH-032",
        "An instance name was given to a node whose certificate is not a worker's, or the name is not a DNS label",
        "Give --instance to workers only, as a pod's name: lowercase letters, digits and '-', at most 63",
        &["framework/runtime/src/node/builder.rs"],
    ),
    code(
        "NODE-AUTH-033",
        "Only the certificate that submitted a job, an admin, an observer or the head may read its log",
        "Ask with the job owner's certificate, an admin's or an observer's (`node certs issue --role observer`)",
        &["framework/proto/src/authority.rs"],
    ),
    code(
        "NODE-BULK-001",
        "Cannot start the bulk lane's threads: …",
        "Check the process's thread limit (ulimit -u) and memory",
        &["framework/runtime/src/net/bulk.rs"],
    ),
    code(
        "NODE-CERT-001",
        "A certificate, key, CA or cookie file cannot be read",
        "Check the path it names exists and is readable by the node's user",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-002",
        "… is not a valid PEM …: …",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-003",
        "Cannot generate certificate: …",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-004",
        "… is not a valid node name (letters, digits, '-' and '.', at most 63 characters)",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-005",
        "`node certs init` would overwrite a file that exists",
        "Remove it first to create a new one, or keep the existing CA",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-006",
        "The cookie file is empty",
        "Copy the `cookie` file `node certs init` wrote; it holds the cluster cookie",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-007",
        "The system's random number generator failed",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-008",
        "No cluster cookie beside the certificate",
        "Copy the `cookie` file `node certs init` wrote into the certs folder",
        &[
            "framework/runtime/src/control/query_error.rs",
            "framework/runtime/src/node/builder.rs",
        ],
    ),
    code(
        "NODE-CERT-009",
        "A certificate carries no role",
        "Issue a new certificate with `node certs issue --role …`",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-010",
        "The CA in … issued no certificate named … (see …/issued.tsv)",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-011",
        "… is not a revocation list signed by the cluster CA: …",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CERT-012",
        "A certificate must be valid for at least one day",
        "Fix the certificates folder as the message says; `node certs init` and `node certs issue` make what a node needs",
        &["framework/transport/src/certs.rs"],
    ),
    code(
        "NODE-CKPT-001",
        "Checkpoint store …: …",
        "Check the checkpoint store the message names: that it exists, is writable and holds only this cluster's checkpoints",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-002",
        "A corrupt checkpoint was skipped; the one before it is used",
        "Nothing to do; remove the corrupt file once you have looked at it",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-003",
        "Checkpoint store … …: …",
        "Check the checkpoint store the message names: that it exists, is writable and holds only this cluster's checkpoints",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-004",
        "Actor name … cannot name a checkpoint (use letters, digits, '.', '-', '_')",
        "Check the checkpoint store the message names: that it exists, is writable and holds only this cluster's checkpoints",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-005",
        "A checkpoint failpoint fired (fault tests only)",
        "Unset FLOTILLA_FAILPOINTS",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-006",
        "A checkpoint save from a stale epoch was refused: a newer copy of the actor runs",
        "Nothing to do: the stale copy stops",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-007",
        "Checkpoint of … at epoch … refused: it is more than a minute ahead of this node's clock (…), so no supervisor issued it",
        "Check the checkpoint store the message names: that it exists, is writable and holds only this cluster's checkpoints",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CKPT-008",
        "Checkpoint of … cannot be fenced: its start has no epoch or no issuer",
        "Register the kind with NodeBuilder::fences_checkpoints and start it under a supervisor, or save unfenced",
        &["framework/runtime/src/supervisor/checkpoint.rs"],
    ),
    code(
        "NODE-CONFIG-001",
        "The --config file cannot be read",
        "Check the path and its permissions",
        &["nodes/node/src/lib.rs"],
    ),
    code(
        "NODE-CONFIG-002",
        "The --config file is not valid node.toml",
        "Fix the entry the message names",
        &["nodes/node/src/lib.rs"],
    ),
    code(
        "NODE-CONFIG-003",
        "--… is required (as a flag or in --config)",
        "Fix the flag or the node.toml entry the message names",
        &["nodes/node/src/lib.rs"],
    ),
    code(
        "NODE-CONFIG-004",
        "A flag or node.toml value is out of range or inconsistent",
        "Fix the value the message names",
        &["nodes/node/src/lib.rs"],
    ),
    code(
        "NODE-CONFIG-005",
        "Cannot serve metrics on …: …",
        "Fix the flag or the node.toml entry the message names",
        &["nodes/node/src/run.rs"],
    ),
    code(
        "NODE-CONFIG-006",
        "Kind … is not registered as configurable on this node",
        "Fix the flag or the node.toml entry the message names",
        &["framework/runtime/src/node/config_args.rs"],
    ),
    code(
        "NODE-CONFIG-007",
        "A supervision tree in node.toml is invalid",
        "Fix the `[[supervisor]]` entry the message names",
        &["nodes/node/src/lib.rs"],
    ),
    code(
        "NODE-CONFIG-008",
        "A declared resource cannot hold (a bad name or amount)",
        "Fix the `--resource` flag or `[resources]` entry",
        &["framework/runtime/src/node/builder.rs"],
    ),
    code(
        "NODE-DASH-001",
        "The dashboard listens on a loopback address only (… is not one)",
        "Give --listen a 127.0.0.1 or [::1] address; reach it from another machine through an SSH tunnel",
        &["nodes/node/src/dashboard/mod.rs"],
    ),
    code(
        "NODE-DASH-002",
        "Cannot listen on …: …",
        "Free the port or give --listen another one",
        &["nodes/node/src/dashboard/mod.rs"],
    ),
    code(
        "NODE-DRAIN-001",
        "No member of the cluster has the name a drain asked for",
        "Check the name with `node status`",
        &["framework/proto/src/membership.rs"],
    ),
    code(
        "NODE-DRAIN-002",
        "The member a drain asked for is down or has left already",
        "Nothing to drain: its bundles are placed again as a lost node's",
        &["framework/proto/src/membership.rs"],
    ),
    code(
        "NODE-DRAIN-003",
        "The head is not drained: it keeps the member table",
        "Stop the head itself, or hand over to another head of a head set",
        &["framework/proto/src/membership.rs"],
    ),
    code(
        "NODE-DRAIN-004",
        "The head cannot be asked to drain this node (unreachable, or no answer in time)",
        "Check that the head runs and is reachable; the node stops without a drain otherwise",
        &["framework/runtime/src/node/drain.rs"],
    ),
    code(
        "NODE-DRAIN-005",
        "The head answered a drain request with something else than a drain's outcome",
        "Run the same version of `node` on the head and the members",
        &["framework/runtime/src/node/drain.rs"],
    ),
    code(
        "NODE-FAIL-001",
        "A FLOTILLA_FAILPOINTS entry is malformed",
        "Fix the entry it names (`name=action;…`)",
        &["framework/runtime/src/node/failpoints.rs"],
    ),
    code(
        "NODE-JOB-001",
        "The job's settings are invalid",
        "Fix the setting the message names",
        &["framework/runtime/src/jobs/mod.rs"],
    ),
    code(
        "NODE-JOB-002",
        "The head serves no jobs (start it with the node binary, or call Node::serve_jobs)",
        "Fix the job as the message says, or ask the head (`node jobs`)",
        &[
            "framework/runtime/src/jobs/mod.rs",
            "nodes/node/src/jobs.rs",
        ],
    ),
    code(
        "NODE-JOB-003",
        "The head answered a jobs request with something this release does not expect",
        "Run the same `node` release on the head and the client",
        &[
            "framework/runtime/src/jobs/mod.rs",
            "nodes/node/src/jobs.rs",
            "nodes/node/src/run.rs",
        ],
    ),
    code(
        "NODE-JOB-004",
        "No job of that id is known (or running) on the head",
        "List the jobs with `node jobs list`",
        &["nodes/node/src/jobs.rs"],
    ),
    code(
        "NODE-JOB-005",
        "Job … did not end within … s",
        "Fix the job as the message says, or ask the head (`node jobs`)",
        &["nodes/node/src/jobs.rs"],
    ),
    code(
        "NODE-JOB-006",
        "The head refused a jobs request",
        "See the reason it gives; only the submitting certificate, an admin or the head may stop a job",
        &["framework/runtime/src/jobs/mod.rs"],
    ),
    code(
        "NODE-JOB-007",
        "This node runs no detached jobs: it allows no input or output roots (set `[jobs] allow = [...]` in node.toml, or --allow-path)",
        "Fix the job as the message says, or ask the head (`node jobs`)",
        &["framework/proto/src/roots.rs"],
    ),
    code(
        "NODE-JOB-008",
        "… … is not an absolute path",
        "Fix the job as the message says, or ask the head (`node jobs`)",
        &["framework/proto/src/roots.rs"],
    ),
    code(
        "NODE-JOB-009",
        "… … is outside the roots this node allows for jobs (…)",
        "See `[jobs] allow` in node.toml, or --allow-path",
        &["framework/proto/src/roots.rs"],
    ),
    code(
        "NODE-JOB-010",
        "The job's description is … bytes, more than the … a head takes (name where the data is",
        "Do not carry it)",
        &["framework/proto/src/jobs.rs"],
    ),
    code(
        "NODE-JOB-011",
        "… has … jobs running, the most one certificate may have at once (…)",
        "Wait for one to end or stop one",
        &["framework/runtime/src/jobs/mod.rs"],
    ),
    code(
        "NODE-JOIN-001",
        "No answer from the head at … within …",
        "Check that --head points at the head and the head is up; the node retries on its own",
        &["framework/runtime/src/member/mod.rs"],
    ),
    code(
        "NODE-JOIN-002",
        "The head refused this node: …",
        "Check that --head points at the head and the head is up; the node retries on its own",
        &["framework/runtime/src/member/mod.rs"],
    ),
    code(
        "NODE-JOIN-003",
        "This node is not the head",
        "Point --head at the head's address",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-JOIN-005",
        "A newer incarnation of this node is a member",
        "Stop it first",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-JOIN-006",
        "The head marked this node down",
        "Rejoining with a new incarnation",
        &["framework/runtime/src/member/mod.rs"],
    ),
    code(
        "NODE-JOIN-007",
        "The join's addresses, labels or resources exceed their bounds (64 labels and 64 custom resources of at most 64-byte names and 256-byte values)",
        "Check that --head points at the head and the head is up; the node retries on its own",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-JOIN-008",
        "The join names another incarnation than its stream's hello",
        "Check that --head points at the head and the head is up; the node retries on its own",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-JOIN-009",
        "A live member is named … (incarnation … at …, heard … ms ago)",
        "Stop it first, or give this node another name",
        &["framework/proto/src/membership.rs"],
    ),
    code(
        "NODE-JOIN-010",
        "Fenced: stopped the actors this node hosted for others before rejoining",
        "Check that --head points at the head and the head is up; the node retries on its own",
        &["framework/runtime/src/member/mod.rs"],
    ),
    code(
        "NODE-JOIN-011",
        "This certificate already has … members in the table (… for a worker pool; up, or ended and not yet forgotten)",
        "Stop some of its processes, or give them certificates of their own",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-LEASE-001",
        "Cannot read the head lease",
        "Check the lease store (`[head_set] lease_store`) is reachable and writable; the head that holds the lease keeps serving",
        &["framework/runtime/src/head/head_lease.rs"],
    ),
    code(
        "NODE-LEASE-002",
        "The lease store gives no version (ETag)",
        "It cannot hold a lease",
        &["framework/runtime/src/head/head_lease.rs"],
    ),
    code(
        "NODE-LEASE-003",
        "The head lease record is not readable",
        "No head takes it over until it is removed",
        &["framework/runtime/src/head/head_lease.rs"],
    ),
    code(
        "NODE-LEASE-004",
        "This head lost the head set's lease",
        "Ending at once",
        &[
            "framework/runtime/src/head/head_lease.rs",
            "nodes/node/src/run.rs",
        ],
    ),
    code(
        "NODE-LEASE-005",
        "Cannot read the head state under …: …",
        "Check the lease store (`[head_set] lease_store`) is reachable and writable; the head that holds the lease keeps serving",
        &["framework/runtime/src/head/head_replica.rs"],
    ),
    code(
        "NODE-LEASE-006",
        "A head set's lease store or state mirror cannot be opened",
        "Fix `[head_set] lease_store` (an object-store URL the head can write)",
        &["nodes/node/src/head_set.rs"],
    ),
    code(
        "NODE-NET-001",
        "Cannot connect to …: …",
        "Check the address and that the peer is up and reachable",
        &["framework/transport/src/endpoint.rs"],
    ),
    code(
        "NODE-NET-002",
        "Cannot listen on …: …",
        "Check the address and that the peer is up and reachable",
        &["framework/transport/src/endpoint.rs"],
    ),
    code(
        "NODE-OBJ-001",
        "An object of … bytes cannot fit a store of … bytes",
        "Raise --object-store-mb",
        &["framework/objects/src/store.rs"],
    ),
    code(
        "NODE-OBJ-002",
        "Object store full: … bytes did not fit (… of … in use) within …",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &["framework/objects/src/store.rs"],
    ),
    code(
        "NODE-OBJ-003",
        "Object … is gone (freed by its owner, or its process ended)",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &["framework/objects/src/store.rs"],
    ),
    code(
        "NODE-OBJ-004",
        "Malformed object reference: …",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &[
            "framework/objects/src/store.rs",
            "nodes/node/src/objects.rs",
        ],
    ),
    code(
        "NODE-OBJ-005",
        "Segment of object … does not match its reference (…)",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &["framework/objects/src/store.rs"],
    ),
    code(
        "NODE-OBJ-006",
        "An object's bytes are not a valid archive of the type it is read as",
        "Read it as the type it was put with; a copy damaged in transit is refused, not used",
        &["framework/objects/src/in_place.rs"],
    ),
    code(
        "NODE-OBJ-007",
        "Object … arrived with checksum …, its reference says …",
        "The copy was dropped",
        &["framework/objects/src/store.rs"],
    ),
    code(
        "NODE-OBJ-008",
        "The object store's shared-memory segment cannot be made or mapped",
        "Check /dev/shm has room and the node's user may write there",
        &["framework/objects/src/store.rs"],
    ),
    code(
        "NODE-OBJ-009",
        "Cannot pull object …: its owner … is not an up member",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &["framework/runtime/src/objects/mod.rs"],
    ),
    code(
        "NODE-OBJ-010",
        "Pulling object … from … failed: …",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &["framework/runtime/src/objects/mod.rs"],
    ),
    code(
        "NODE-OBJ-011",
        "… refused to release … object(s) that were not lent to this node",
        "See the message: a reference must come from a put of this cluster, and its owner must be up",
        &["framework/runtime/src/objects/mod.rs"],
    ),
    code(
        "NODE-PG-001",
        "Invalid placement group: …",
        "Check the group's bundles fit the cluster's free resources (`node status`), or wait longer",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-002",
        "Placement group … failed: …",
        "Check the group's bundles fit the cluster's free resources (`node status`), or wait longer",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-003",
        "Placement group … is not ready after … (…): …",
        "Check the group's bundles fit the cluster's free resources (`node status`), or wait longer",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-004",
        "No placement group …",
        "Check the group's bundles fit the cluster's free resources (`node status`), or wait longer",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-005",
        "Placement group … has no bundle …",
        "Check the group's bundles fit the cluster's free resources (`node status`), or wait longer",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-006",
        "The head answered a placement request with something this release does not expect",
        "Run the same `node` release on every member",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-007",
        "The head refused a placement request",
        "See the reason it gives; only a group's creator, an admin or the head may remove it",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PG-008",
        "This certificate already waits on … groups at the head",
        "Wait on fewer at once",
        &["framework/runtime/src/placement/mod.rs"],
    ),
    code(
        "NODE-PG-009",
        "A placement group did not grow: it is not ready, or no node has room for one more bundle under its strategy now",
        "Wait for a node with room to join (a job tries again on every change of the member table)",
        &["framework/runtime/src/node/placement_groups.rs"],
    ),
    code(
        "NODE-PROTO-001",
        "Protocol version mismatch",
        "Run the same `node` release on every member",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-SPAWN-004",
        "The node hosts no actor of that name",
        "Check the actor's name on that node (`node status`), and stop actors you no longer need",
        &["framework/proto/src/control.rs"],
    ),
    code(
        "NODE-SPAWN-005",
        "The actor was asked to stop but has not ended yet",
        "Check the actor's name on that node (`node status`), and stop actors you no longer need",
        &["framework/proto/src/control.rs"],
    ),
    code(
        "NODE-SPAWN-006",
        "… already owns … actors on that node",
        "Stop some first",
        &["framework/proto/src/control.rs"],
    ),
    code(
        "NODE-START-001",
        "Cannot start the actor system: …",
        "The process is short of threads or memory; check its limits and restart it",
        &["framework/runtime/src/node/builder.rs"],
    ),
    code(
        "NODE-START-002",
        "The actor system stopped while the node started",
        "The process is short of threads or memory; check its limits and restart it",
        &["framework/runtime/src/node/builder.rs"],
    ),
    code(
        "NODE-STATE-001",
        "The incarnation record cannot be read or written",
        "Set --state-dir to a writable folder",
        &["framework/runtime/src/identity.rs"],
    ),
    code(
        "NODE-STATE-002",
        "The incarnation record does not hold a number",
        "Replacing it, with the clock as the floor",
        &["framework/runtime/src/identity.rs"],
    ),
    code(
        "NODE-STATUS-001",
        "The status query could not reach the node, or it did not answer",
        "Check the address and that the node is up; the query tries every head given",
        &["framework/runtime/src/control/query_error.rs"],
    ),
    code(
        "NODE-STATUS-002",
        "The queried node refused the request",
        "Use a certificate whose role may query it (`node certs issue --role observer`)",
        &["framework/runtime/src/control/query_error.rs"],
    ),
    code(
        "NODE-STATUS-003",
        "No head address given",
        "Check the address and the certificates passed to the query",
        &["framework/runtime/src/control/query_error.rs"],
    ),
    code(
        "NODE-STATUS-004",
        "…'s answer of … bytes is over the frame limit of … bytes",
        "Ask for less at once",
        &[
            "framework/runtime/src/control/mod.rs",
            "framework/runtime/src/control/query_error.rs",
        ],
    ),
    code(
        "NODE-STORE-001",
        "The head's store cannot be opened or read",
        "Fix or move aside the file it names; the head starts with an empty store without it",
        &[
            "framework/runtime/src/node/builder.rs",
            "nodes/node/src/run.rs",
        ],
    ),
    code(
        "NODE-STORE-002",
        "The head could not record the group: …",
        "Fix or move aside the head's store file the message names",
        &["framework/runtime/src/placement/mod.rs"],
    ),
    code(
        "NODE-TLS-001",
        "Invalid certificate or key: …",
        "Issue the certificate again with `node certs issue`",
        &["framework/transport/src/tls.rs"],
    ),
    code(
        "NODE-TLS-002",
        "Invalid cluster CA: …",
        "Issue the certificate again with `node certs issue`",
        &["framework/transport/src/tls.rs"],
    ),
    code(
        "NODE-TLS-003",
        "This listener takes no connections",
        "Members speak over QUIC",
        &["framework/transport/src/tls.rs"],
    ),
    code(
        "NODE-TREE-001",
        "Supervisor … gave up: …",
        "See the supervisor's last error in the log; the unit restarts the process and the tree with it",
        &["nodes/node/src/run.rs"],
    ),
    code(
        "NODE-TREE-002",
        "Supervisor … did not start: …",
        "See the supervisor's last error in the log; the unit restarts the process and the tree with it",
        &["nodes/node/src/trees.rs"],
    ),
    code(
        "NODE-WIRE-001",
        "Dropped a remote message with an invalid archive",
        "Run the same `node` release on every member; a peer sending malformed frames is closed and counted",
        &["framework/runtime/src/remote/wire.rs"],
    ),
    code(
        "NODE-WIRE-002",
        "The peer refused the hello",
        "Run the same `node` release on every member; a peer sending malformed frames is closed and counted",
        &[
            "framework/transport/src/closing.rs",
            "framework/transport/src/handshake.rs",
        ],
    ),
    code(
        "NODE-WIRE-003",
        "Closing connection after a malformed bulk frame",
        "Run the same `node` release on every member; a peer sending malformed frames is closed and counted",
        &[
            "framework/runtime/src/net/bulk.rs",
            "framework/transport/src/closing.rs",
        ],
    ),
    code(
        "NODE-WIRE-004",
        "This endpoint does not take streams of that purpose",
        "Run the same `node` release on every member; a peer sending malformed frames is closed and counted",
        &["framework/proto/src/hello.rs"],
    ),
    code(
        "NODE-WIRE-005",
        "The peer closed the connection: no hello in time",
        "Run the same `node` release on every member; a peer sending malformed frames is closed and counted",
        &[
            "framework/transport/src/closing.rs",
            "framework/transport/src/handshake.rs",
        ],
    ),
    code(
        "NODE-WIRE-006",
        "The peer is shutting down",
        "Run the same `node` release on every member; a peer sending malformed frames is closed and counted",
        &["framework/transport/src/closing.rs"],
    ),
];

/// The code `id`, if it is registered.
pub fn lookup(id: &str) -> Option<&'static Code> {
    CODES.iter().find(|c| c.id == id)
}

/// The codes written in `text`, in order (`NODE-AREA-NNN`, the area in
/// capitals, three digits).
pub fn codes_in(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find("NODE-") {
        let start = at + i;
        let mut end = start + 5;
        while end < bytes.len() && bytes[end].is_ascii_uppercase() {
            end += 1;
        }
        let digits = end + 1..end + 4;
        if end > start + 5
            && bytes.get(end) == Some(&b'-')
            && bytes
                .get(digits.clone())
                .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
            && !bytes.get(digits.end).is_some_and(u8::is_ascii_alphanumeric)
        {
            found.push(&text[start..digits.end]);
            at = digits.end;
        } else {
            at = start + 5;
        }
    }
    found
}

/// The table as `docs/codes.md` holds it.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Codes\n\n\
         Every error, refusal and warning an operator may see opens with a code.\n\
         This page is rendered from `framework/proto/src/codes.rs`, the one place\n\
         codes are declared (`FLOTILLA_WRITE_CODES=1 cargo test -p flotilla-proto codes`\n\
         writes it again; the tests fail while it differs).\n\n\
         | code | meaning | what to do |\n| --- | --- | --- |\n",
    );
    for c in CODES {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            c.id,
            c.meaning.replace('|', "\\|"),
            c.fix.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The `.rs` files under `dir`, build outputs left out.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() && name != "target" && !name.to_string_lossy().starts_with('.') {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The text of a source file that raises codes: none in tests/, and
    /// none in a `#[cfg(test)]` module (wherever it sits in the file).
    fn raising_part(rel: &str, text: &str) -> String {
        if rel.starts_with("tests/") || rel.contains("/tests/") {
            return String::new();
        }
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("#[cfg(test)]\nmod ") {
            out.push_str(&rest[..at]);
            let body = &rest[at..];
            let Some(open) = body.find('{') else {
                return out;
            };
            let mut depth = 0usize;
            let mut end = body.len();
            for (i, ch) in body[open..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = open + i + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = &body[end..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn each_code_is_registered_once_in_order() {
        let mut seen = BTreeSet::new();
        for c in CODES {
            assert_eq!(codes_in(c.id), vec![c.id], "{} is not NODE-AREA-NNN", c.id);
            assert!(seen.insert(c.id), "{} is registered twice", c.id);
            assert!(!c.meaning.is_empty() && !c.fix.is_empty(), "{}", c.id);
            assert!(!c.raised_in.is_empty(), "{} is raised nowhere", c.id);
        }
        let key = |c: &Code| {
            let (area, n) = c.id[5..].split_once('-').unwrap();
            (area.to_owned(), n.to_owned())
        };
        assert!(CODES.windows(2).all(|w| key(&w[0]) < key(&w[1])), "sorted");
    }

    #[test]
    fn codes_are_found_in_text() {
        assert_eq!(
            codes_in("x NODE-AUTH-002: y (NODE-JOB-009) NODE-AUTH-0023 NODE-x-001 NODE-OBJ-01"),
            vec!["NODE-AUTH-002", "NODE-JOB-009"]
        );
    }

    #[test]
    fn every_code_in_the_workspace_is_registered_and_raised_where_registered() {
        let root = workspace();
        let mut files = Vec::new();
        for dir in ["framework", "nodes", "apps", "examples", "benches", "tests"] {
            sources(&root.join(dir), &mut files);
        }
        let this = Path::new(file!());
        let mut raised: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        let mut problems = Vec::new();
        for file in &files {
            let rel = file
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if rel.ends_with(this.to_string_lossy().as_ref()) || rel.ends_with("proto/src/codes.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            for id in codes_in(&text) {
                if lookup(id).is_none() {
                    problems.push(format!("{rel}: {id} is not registered in codes.rs"));
                }
            }
            for id in codes_in(&raising_part(&rel, &text)) {
                if let Some(c) = lookup(id) {
                    raised.entry(c.id).or_default().insert(rel.clone());
                    if !c.raised_in.contains(&rel.as_str()) {
                        problems.push(format!(
                            "{rel}: raises {id}, which codes.rs gives to {:?} only: a second meaning takes a code of its own",
                            c.raised_in
                        ));
                    }
                }
            }
        }
        for c in CODES {
            for file in c.raised_in {
                if !raised.get(c.id).is_some_and(|r| r.contains(*file)) {
                    problems.push(format!(
                        "{}: codes.rs says {file} raises it; it does not",
                        c.id
                    ));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_docs_name_registered_codes_and_list_them_all() {
        let root = workspace();
        let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.push(root.join("README.md"));
        for doc in &docs {
            let text = std::fs::read_to_string(doc).unwrap();
            for id in codes_in(&text) {
                assert!(
                    lookup(id).is_some(),
                    "{}: {id} is not registered",
                    doc.display()
                );
            }
        }
        let page = root.join("docs/codes.md");
        if std::env::var_os("FLOTILLA_WRITE_CODES").is_some() {
            std::fs::write(&page, markdown()).unwrap();
        }
        let written = std::fs::read_to_string(&page).unwrap_or_default();
        assert!(
            written == markdown(),
            "docs/codes.md differs from codes.rs: run FLOTILLA_WRITE_CODES=1 cargo test -p flotilla-proto codes"
        );
    }
}
