//! An actor kind of the examples' own, `example.text_stats`: it measures
//! texts (characters, and words of at least `min_word_len` characters) and
//! keeps running totals. Registered configurable, so a `node.toml`
//! supervision tree can start it by kind with its arguments (see
//! `my_node`).

use flotilla::NodeBuilder;
use flotilla::pipeline::{BatchId, Stage, Verdict};
use flotilla::ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla_data::Row;

/// The kind.
pub const TEXT_STATS: flotilla::ActorKind<TextStatsMsg, TextStatsArgs> =
    flotilla::ActorKind::new("example.text_stats");

/// Its arguments, written in `node.toml` as a child's `args`.
#[derive(Archive, Serialize, Deserialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct TextStatsArgs {
    /// Words shorter than this many characters are not counted (0: all).
    #[serde(default)]
    pub min_word_len: u32,
    /// Milliseconds each request takes at least (a stand-in for a model's
    /// work; 0: none).
    #[serde(default)]
    pub work_ms: u32,
}

/// Texts to measure.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Texts(pub Vec<String>);

/// One text's measure.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct TextStat {
    /// Its characters (Unicode scalar values).
    pub chars: u32,
    /// Its words (split at whitespace) of at least the minimum length.
    pub words: u32,
}

/// The measures of [`Texts`], in their order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Stats(pub Vec<TextStat>);

/// What an actor has measured since it started.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Totals {
    /// Texts measured.
    pub texts: u64,
    /// Words counted in them.
    pub words: u64,
}

flotilla::remote_type!(TextStatsArgs, Texts, Stats, Totals);

/// Messages of [`TextStats`].
#[derive(RactorClusterMessage)]
pub enum TextStatsMsg {
    /// Measure these texts.
    #[rpc]
    Measure(Texts, RpcReplyPort<Stats>),
    /// The totals so far.
    #[rpc]
    Totals(RpcReplyPort<Totals>),
}

/// The actor.
pub struct TextStats;

/// Its state: its arguments and totals.
pub struct TextStatsState {
    min_word_len: usize,
    work: std::time::Duration,
    totals: Totals,
}

/// The measure of `text`, counting words of at least `min_word_len`
/// characters.
pub fn measure(text: &str, min_word_len: usize) -> TextStat {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    TextStat {
        chars: count(text.chars().count()),
        words: count(
            text.split_whitespace()
                .filter(|w| w.chars().count() >= min_word_len)
                .count(),
        ),
    }
}

impl Actor for TextStats {
    type Msg = TextStatsMsg;
    type State = TextStatsState;
    type Arguments = TextStatsArgs;

    async fn pre_start(
        &self,
        _: ActorRef<TextStatsMsg>,
        args: TextStatsArgs,
    ) -> Result<TextStatsState, ActorProcessingErr> {
        Ok(TextStatsState {
            min_word_len: args.min_word_len as usize,
            work: std::time::Duration::from_millis(args.work_ms.into()),
            totals: Totals::default(),
        })
    }

    async fn handle(
        &self,
        _: ActorRef<TextStatsMsg>,
        msg: TextStatsMsg,
        state: &mut TextStatsState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TextStatsMsg::Measure(Texts(texts), reply) => {
                tokio::time::sleep(state.work).await;
                let stats: Vec<TextStat> = texts
                    .iter()
                    .map(|t| measure(t, state.min_word_len))
                    .collect();
                state.totals.texts += stats.len() as u64;
                state.totals.words += stats.iter().map(|s| u64::from(s.words)).sum::<u64>();
                let _ = reply.send(Stats(stats));
            }
            TextStatsMsg::Totals(reply) => {
                let _ = reply.send(state.totals);
            }
        }
        Ok(())
    }
}

/// How a batch job sends its rows to [`TextStats`] actors and checks
/// their answers ([`flotilla_data::job`]).
pub struct MeasureStage;

impl Stage for MeasureStage {
    type Msg = TextStatsMsg;
    type Batch = Vec<Row>;
    type Reply = Stats;
    type Output = Vec<TextStat>;

    fn request(&self, _: BatchId, rows: &Vec<Row>, reply: RpcReplyPort<Stats>) -> TextStatsMsg {
        TextStatsMsg::Measure(Texts(rows.iter().map(|r| r.text.clone()).collect()), reply)
    }

    fn judge(&self, _: BatchId, rows: &Vec<Row>, Stats(stats): Stats) -> Verdict<Vec<TextStat>> {
        if stats.len() == rows.len() {
            Verdict::Done(stats)
        } else {
            Verdict::Retry(format!("{} measures for {} texts", stats.len(), rows.len()))
        }
    }
}

/// Registers [`TextStats`] as [`TEXT_STATS`], configurable.
pub fn register(builder: NodeBuilder) -> NodeBuilder {
    builder.register_configurable(TEXT_STATS, || TextStats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_shorter_than_the_minimum_are_not_counted() {
        assert_eq!(
            measure("a bb ccc  dddd\té", 3),
            TextStat {
                chars: 16,
                words: 2
            }
        );
        assert_eq!(measure("a bb ccc", 0).words, 3);
        assert_eq!(measure("", 0), TextStat { chars: 0, words: 0 });
    }
}
