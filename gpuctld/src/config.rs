//! The controller's configuration: a TOML file with embedded defaults.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Time limit of jobs that set none.
    #[serde(with = "humantime_serde")]
    pub default_time_limit: Duration,
    /// Between SIGTERM and SIGKILL when a job is cancelled or times out.
    #[serde(with = "humantime_serde")]
    pub kill_grace: Duration,
    /// A scheduling pass runs on every event and at least this often.
    #[serde(with = "humantime_serde")]
    pub sched_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_time_limit: Duration::from_secs(3600),
            kill_grace: Duration::from_secs(10),
            sched_interval: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: toml::de::Error,
    },
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_config_keeps_defaults() {
        let c: Config = toml::from_str("kill_grace = \"2s\"").unwrap();
        assert_eq!(c.kill_grace, Duration::from_secs(2));
        assert_eq!(c.default_time_limit, Duration::from_secs(3600));
    }

    #[test]
    fn unknown_key_is_an_error() {
        assert!(toml::from_str::<Config>("kill_grase = \"2s\"").is_err());
    }
}
