//! Actor kinds with types: the name nodes register a kind under, with the
//! message type its actors take and the arguments they start from, so a
//! registration's factory, a spawn's arguments and the reference it
//! returns are checked against one another when the program compiles, and
//! a kind is never a string that could stand in a node's or an actor's
//! place.

use std::marker::PhantomData;

/// A kind of actor that nodes register ([`NodeBuilder::register`]) and
/// spawn ([`Node::spawn_on`]) by name: its actors take messages `M` and
/// start from arguments `A`.
///
/// [`NodeBuilder::register`]: crate::NodeBuilder::register
/// [`Node::spawn_on`]: crate::Node::spawn_on
///
/// ```
/// use flotilla::ActorKind;
/// use flotilla::node::doc_example::{Count, CounterMsg};
/// const COUNTER: ActorKind<CounterMsg, Count> = ActorKind::new("doc.counter");
/// let named = COUNTER.named("c1");
/// assert_eq!((named.kind().name(), named.name()), ("doc.counter", "c1"));
/// ```
pub struct ActorKind<M, A> {
    name: &'static str,
    types: PhantomData<fn(A) -> M>,
}

impl<M, A> ActorKind<M, A> {
    /// The kind registered as `name`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            types: PhantomData,
        }
    }

    /// The name it is registered under.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// An actor of this kind named `actor` (unique on the node it runs
    /// on): what a spawn starts.
    pub fn named(self, actor: impl Into<String>) -> Named<M, A> {
        Named {
            kind: self,
            name: actor.into(),
        }
    }
}

impl<M, A> Clone for ActorKind<M, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M, A> Copy for ActorKind<M, A> {}

impl<M, A> std::fmt::Debug for ActorKind<M, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ActorKind").field(&self.name).finish()
    }
}

impl<M, A> std::fmt::Display for ActorKind<M, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// An actor of a kind, by the name it will run under
/// ([`ActorKind::named`]).
pub struct Named<M, A> {
    kind: ActorKind<M, A>,
    name: String,
}

impl<M, A> Named<M, A> {
    /// Its kind.
    pub fn kind(&self) -> ActorKind<M, A> {
        self.kind
    }

    /// The actor's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<M, A> Clone for Named<M, A> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind,
            name: self.name.clone(),
        }
    }
}

impl<M, A> std::fmt::Debug for Named<M, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Named")
            .field("kind", &self.kind.name)
            .field("name", &self.name)
            .finish()
    }
}
