//! What `node status` shows, gathered from the head and every member:
//! the member table, placement, GPUs, supervisors and object stores. Used
//! by `node status` and by the dashboard.

/// What [`gather_status`] asks of every member beside the table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gather {
    /// Each node's supervisors.
    pub(crate) supervisors: bool,
    /// Each node's object-store counters.
    pub(crate) objects: bool,
}

/// Everything `node status` shows, asked as `identity` of the first of
/// `heads` that answers: the member table, placement (from the head), the
/// GPUs of nodes that offer them, and what `asked` names of every up node.
pub(crate) async fn gather_status(
    heads: &[std::net::SocketAddr],
    identity: &flotilla_transport::Identity,
    asked: Gather,
) -> Result<flotilla::render::StatusReport, flotilla::status::StatusError> {
    let (head, table) = flotilla::status::first_answer(heads, |addr| {
        flotilla::query_status(addr, identity.clone())
    })
    .await?;
    let supervisors = if asked.supervisors {
        supervisors_of(&table, identity).await
    } else {
        flotilla::render::Supervisors::new()
    };
    // The head accounts placement; any other node says so.
    let placement = flotilla::query_placement(head, identity.clone()).await.ok();
    // Only nodes that offer GPUs are asked who holds them.
    let gpus = answers_of(
        &table,
        identity,
        |m| m.resources.gpus > 0,
        flotilla::query_gpus,
    )
    .await;
    let objects = if asked.objects {
        answers_of(&table, identity, |_| true, flotilla::query_objects).await
    } else {
        flotilla::render::ObjectCounts::new()
    };
    Ok(flotilla::render::StatusReport {
        table,
        supervisors,
        placement,
        objects,
        gpus,
    })
}

/// Asks every up member of `table` for its supervisors, all at once.
async fn supervisors_of(
    table: &flotilla::Table,
    identity: &flotilla_transport::Identity,
) -> flotilla::render::Supervisors {
    let asks = table.up().map(|m| {
        let (name, addr, identity) = (m.name.clone(), m.addr.clone(), identity.clone());
        async move {
            const WITHIN: std::time::Duration = std::time::Duration::from_secs(1);
            let answer = match addr.parse() {
                Ok(addr) => {
                    match tokio::time::timeout(WITHIN, flotilla::query_supervisors(addr, identity))
                        .await
                    {
                        Ok(answer) => answer.map_err(|e| e.to_string()),
                        Err(_) => Err(format!("no answer within {WITHIN:?}")),
                    }
                }
                Err(_) => Err(format!("address {addr:?} is not a socket address")),
            };
            (name, answer)
        }
    });
    futures::future::join_all(asks).await.into_iter().collect()
}

/// What each up member that `asks` selects answers to `query`, for those
/// that answer within a second, by node name.
async fn answers_of<T, F, Fut, E>(
    table: &flotilla::Table,
    identity: &flotilla_transport::Identity,
    asks: impl Fn(&flotilla::MemberView) -> bool,
    query: F,
) -> std::collections::BTreeMap<flotilla::MemberName, T>
where
    F: Fn(std::net::SocketAddr, flotilla_transport::Identity) -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let calls = table.up().filter(|m| asks(m)).map(|m| {
        let name = m.name.clone();
        let call = m
            .addr
            .parse()
            .ok()
            .map(|addr| query(addr, identity.clone()));
        async move {
            let within = std::time::Duration::from_secs(1);
            let answer = tokio::time::timeout(within, call?).await.ok()?.ok()?;
            Some((name, answer))
        }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}
