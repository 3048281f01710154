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

/// Everything `node status` shows, asked through `client` of the first
/// of `heads` that answers: the member table, placement (from the head),
/// the GPUs of nodes that offer them, and what `asked` names of every up
/// node.
pub(crate) async fn gather_status(
    heads: &[std::net::SocketAddr],
    client: &flotilla::ControlClient,
    asked: Gather,
) -> Result<flotilla::render::StatusReport, flotilla::status::StatusError> {
    let (head, table) = flotilla::status::first_answer(heads, |addr| client.status(addr)).await?;
    let supervisors = if asked.supervisors {
        answers_of(&table, |_| true, |a| client.supervisors(a))
            .await
            .into_iter()
            .map(|(name, answer)| (name, answer.map_err(|e| e.to_string())))
            .collect()
    } else {
        flotilla::render::Supervisors::new()
    };
    // The head accounts placement and hears heartbeats; any other node
    // says so.
    let placement = client.placement(head).await.ok();
    let heard = client
        .heard(head)
        .await
        .map(|heard| heard.into_iter().map(|h| (h.name, h.ms_ago)).collect())
        .unwrap_or_default();
    // Only nodes that offer GPUs are asked who holds them.
    let gpus = answers_of(&table, |m| m.resources.gpus > 0, |a| client.gpus(a))
        .await
        .into_iter()
        .filter_map(|(name, answer)| Some((name, answer.ok()?)))
        .collect();
    let objects = if asked.objects {
        answers_of(&table, |_| true, |a| client.objects(a))
            .await
            .into_iter()
            .filter_map(|(name, answer)| Some((name, answer.ok()?)))
            .collect()
    } else {
        flotilla::render::ObjectCounts::new()
    };
    Ok(flotilla::render::StatusReport {
        table,
        supervisors,
        placement,
        objects,
        gpus,
        heard,
    })
}

/// How long a member has to answer.
const WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// What each up member of `table` that `asks` selects answers to `query`
/// (all asked at once), by node name: its answer, or why there is none
/// (an address that is not one, an error, no answer within [`WITHIN`]).
async fn answers_of<T, F, Fut>(
    table: &flotilla::Table,
    asks: impl Fn(&flotilla::MemberView) -> bool,
    query: F,
) -> Vec<(flotilla::MemberName, Result<T, String>)>
where
    F: Fn(std::net::SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<T, flotilla::status::StatusError>>,
{
    let calls = table.up().filter(|m| asks(m)).map(|m| {
        let name = m.name.clone();
        let call = m.addr.parse().map(&query);
        let addr = m.addr.clone();
        async move {
            let answer = match call {
                Ok(call) => match tokio::time::timeout(WITHIN, call).await {
                    Ok(answer) => answer.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {WITHIN:?}")),
                },
                Err(_) => Err(format!("address {addr:?} is not a socket address")),
            };
            (name, answer)
        }
    });
    futures::future::join_all(calls).await
}
