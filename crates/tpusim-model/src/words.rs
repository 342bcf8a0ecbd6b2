//! Option words: enums whose one definition drives parsing (`FromStr`, serde, clap), help text
//! and output, so that no other crate keeps a list of the words.
//!
//! [`word_enum!`](crate::word_enum) declares an enum whose variants each carry the word users
//! type and a doc comment that becomes their help text. The enum gets `ALL`, `word()`,
//! `help()`, `Display`, `FromStr` (errors list the allowed words), serde (as the word) and,
//! with the `clap` feature, `clap::ValueEnum`.

/// A word that is not one of an enum's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{value}\": expected {allowed}")]
pub struct WordError {
    /// What was given.
    pub value: String,
    /// The allowed words, as "a, b or c".
    pub allowed: String,
}

/// Joins words as "a, b or c".
pub fn or_list(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// Declares an option enum (module docs). Each variant is written `Variant = "word"` with an
/// optional doc comment (its help text).
#[macro_export]
macro_rules! word_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[doc = $doc:literal])* $var:ident = $word:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[doc = $doc])* $var ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The word users type for this variant (also its serialised form).
            pub fn word(self) -> &'static str {
                match self { $($name::$var => $word),+ }
            }

            /// The variant's help text (its doc comment).
            pub fn help(self) -> &'static str {
                match self { $($name::$var => concat!($($doc, " "),*).trim()),+ }
            }

            /// Other words accepted for this variant (never printed).
            pub fn aliases(self) -> &'static [&'static str] {
                match self { $($name::$var => &[$($alias),*]),+ }
            }

            /// The allowed words as "a, b or c".
            pub fn allowed() -> String {
                $crate::words::or_list(&[$($word),+])
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.word())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::words::WordError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let t = s.trim();
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.word() == t || v.aliases().contains(&t))
                    .ok_or_else(|| $crate::words::WordError { value: s.to_string(), allowed: $name::allowed() })
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.word())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(::serde::de::Error::custom)
            }
        }

        $crate::__word_enum_clap!($name);
    };
}

/// `clap::ValueEnum` for a [`word_enum!`](crate::word_enum) (with the `clap` feature; the
/// calling crate needs no clap dependency of its own).
#[cfg(feature = "clap")]
#[doc(hidden)]
#[macro_export]
macro_rules! __word_enum_clap {
    ($name:ident) => {
        impl $crate::__private::clap::ValueEnum for $name {
            fn value_variants<'a>() -> &'a [Self] {
                $name::ALL
            }
            fn to_possible_value(&self) -> Option<$crate::__private::clap::builder::PossibleValue> {
                let help = self.help();
                let v = $crate::__private::clap::builder::PossibleValue::new(self.word()).aliases(self.aliases().iter().copied());
                Some(if help.is_empty() { v } else { v.help(help) })
            }
        }
    };
}

/// Without the `clap` feature, option enums are not clap values.
#[cfg(not(feature = "clap"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __word_enum_clap {
    ($name:ident) => {};
}

#[cfg(test)]
mod tests {
    crate::word_enum! {
        /// A test enum.
        pub enum Colour {
            /// The colour of the sky.
            Blue = "blue",
            Dark = "dark-grey" | "dark-gray",
        }
    }

    #[test]
    fn words_parse_print_and_list() {
        assert_eq!("dark-grey".parse::<Colour>().unwrap(), Colour::Dark);
        assert_eq!("dark-gray".parse::<Colour>().unwrap(), Colour::Dark);
        assert_eq!(Colour::Blue.to_string(), "blue");
        assert_eq!(Colour::Blue.help(), "The colour of the sky.");
        let e = "red".parse::<Colour>().unwrap_err().to_string();
        assert_eq!(e, "\"red\": expected blue or dark-grey");
        assert_eq!(serde_json::to_string(&Colour::Dark).unwrap(), "\"dark-grey\"");
        assert_eq!(serde_json::from_str::<Colour>("\"blue\"").unwrap(), Colour::Blue);
        assert!(serde_json::from_str::<Colour>("\"x\"").unwrap_err().to_string().contains("expected blue"));
    }
}
