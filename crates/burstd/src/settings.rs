//! burstd's settings: the `[burstd]` table of burst's configuration file
//! (the same file that lists the devices), overridden by command-line flags.
//!
//! ```toml
//! [burstd]
//! socket = "/run/burst/burstd.sock"
//! socket_mode = "0660"     # who may use RDMA: the socket's owner and group
//! socket_group = "rdma"    # optional
//! user = "burst"           # optional: the user burstd becomes once its port is open
//!
//! [burstd.limits]          # per client (see burstd::limits::Limits)
//! qps = 1024
//! cq_entries = 2097152
//!
//! [[device]]
//! name = "burst0"
//! interface = "eth0"
//! ```
//!
//! ```
//! use burstd::Settings;
//! let s = Settings::from_toml("[burstd]\nsocket = \"/tmp/b.sock\"\nsocket_mode = \"0600\"").unwrap();
//! assert_eq!(s.socket.to_str(), Some("/tmp/b.sock"));
//! assert_eq!(s.socket_mode, 0o600);
//! ```

use std::path::PathBuf;

use serde::Deserialize;

/// Where burstd listens and who may connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The control socket.
    pub socket: PathBuf,
    /// Its permission bits (default 0660: owner and group).
    pub socket_mode: u32,
    /// Its group, if set.
    pub socket_group: Option<String>,
    /// What each user's clients may hold (`[burstd.limits]`).
    pub limits: crate::limits::Limits,
    /// The user burstd becomes once its port and socket are open (keeping
    /// only the capabilities the port uses); `None`: it stays who it is.
    pub user: Option<String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            socket: crate::default_socket(),
            socket_mode: 0o660,
            socket_group: None,
            limits: crate::limits::Limits::default(),
            user: None,
        }
    }
}

#[derive(Debug, Deserialize, Default)]
struct File {
    #[serde(default)]
    burstd: Section,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Section {
    socket: Option<PathBuf>,
    socket_mode: Option<String>,
    socket_group: Option<String>,
    #[serde(default)]
    limits: crate::limits::Limits,
    user: Option<String>,
}

/// A setting that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file is not TOML, or `[burstd]` has unknown keys.
    #[error("burstd: config: {0}")]
    Toml(String),
    /// The mode is not octal.
    #[error("burstd: socket_mode {0:?} is not an octal mode such as \"0660\"")]
    Mode(String),
}

/// An octal mode such as `0660`.
pub fn parse_mode(s: &str) -> Result<u32, SettingsError> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| SettingsError::Mode(s.into()))
}

impl Settings {
    /// The `[burstd]` table of a configuration file's text (other tables
    /// are the devices', read by burst-verbs).
    pub fn from_toml(text: &str) -> Result<Settings, SettingsError> {
        let f: File = toml::from_str(text).map_err(|e| SettingsError::Toml(e.to_string()))?;
        let d = Settings::default();
        Ok(Settings {
            socket: f.burstd.socket.unwrap_or(d.socket),
            socket_mode: match f.burstd.socket_mode {
                Some(m) => parse_mode(&m)?,
                None => d.socket_mode,
            },
            socket_group: f.burstd.socket_group,
            limits: f.burstd.limits,
            user: f.burstd.user,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_sample_configuration_parses() {
        let text = include_str!("../dist/burst.toml");
        let s = Settings::from_toml(text).unwrap();
        assert_eq!(s.socket, PathBuf::from("/run/burst/burstd.sock"));
        assert_eq!(s.socket_mode, 0o660);
        // The same file is a valid burst configuration (devices, daemon).
        let env = |_: &str| None;
        let c = burst_verbs::config::Config::from_sources(
            env,
            Some((std::path::Path::new("burst.toml"), text)),
        );
        match c {
            Ok(c) => assert_eq!(c.daemon, Some(PathBuf::from("/run/burst/burstd.sock"))),
            // eth0 may not exist on the test machine: that is the only
            // acceptable complaint.
            Err(e) => assert!(e.to_string().contains("eth0"), "{e}"),
        }
        assert!(Settings::from_toml("[burstd]\nsocket_mode = \"9\"").is_err());
        assert!(Settings::from_toml("[burstd]\nsokcet = \"/x\"").is_err());
        let l = Settings::from_toml("[burstd.limits]\nqps = 3")
            .unwrap()
            .limits;
        assert_eq!(l.qps, 3);
        assert_eq!(l.cqs, crate::limits::Limits::default().cqs);
        assert!(Settings::from_toml("[burstd.limits]\nqpz = 3").is_err());
    }
}
