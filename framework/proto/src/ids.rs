//! Ids with types: a member's name, a placement group's, a job's. Each reads as the text
//! it is (`&id` where a `&str` is asked, `{id}` in a message), and is
//! archived as that text, so a type cannot be passed where another is
//! meant.

use rkyv::{Archive, Deserialize, Serialize};

/// Defines an id type around its text.
macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(
            Archive, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord,
            Hash,
        )]
        pub struct $name(String);

        impl $name {
            /// The id `id`.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                Self(id)
            }
        }

        impl From<&$name> for $name {
            fn from(id: &$name) -> Self {
                id.clone()
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                Self(id.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }
    };
}

text_id!(
    /// A member's name: the name its certificate carries, under which the
    /// head keeps it in the member table (`head`, `w1`, `d1`).
    MemberName
);

text_id!(
    /// A placement group's id, as the head names it (`PREFIX-N`, the
    /// prefix the head's incarnation).
    GroupId
);

text_id!(
    /// A detached job's id, as the head names it (`job-INCARNATION-N`).
    JobId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_as_its_text_and_archives_as_it() {
        let id = JobId::from("job-1-2");
        assert_eq!(id, "job-1-2");
        assert_eq!(&*id, "job-1-2");
        assert_eq!(id.to_string(), "job-1-2");
        let bytes = crate::wire::encode(&id);
        assert_eq!(crate::wire::encode(&"job-1-2".to_owned()), bytes);
        assert_eq!(crate::wire::decode::<JobId>(&bytes).ok(), Some(id));
        let mut by_id = std::collections::BTreeMap::new();
        by_id.insert(GroupId::from("pg-1"), 1);
        assert_eq!(by_id.get("pg-1"), Some(&1), "looked up by its text");
    }
}
