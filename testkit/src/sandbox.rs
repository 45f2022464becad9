//! Sandboxes without a machine behind them, for orchestration tests on tokio's paused clock:
//! one user's sandbox that can be lost at any moment ([`FakeWorld::lose`]), every call logged
//! with the (paused) time it happened at, commands that always succeed and files kept in
//! memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cloud_core::{Exec, ExecOutput, Sandbox, SandboxError, SandboxProvider, UserId};
use tokio::time::Instant;

/// The provider's whole world: which sandbox generation is alive, its files, and a log of
/// every call with the time it happened at.
#[derive(Default)]
pub struct FakeWorld {
    state: Mutex<WorldState>,
    /// Sandboxes vanish as soon as they are created.
    lose_on_create: bool,
    /// How long `create` takes.
    create_takes: Duration,
}

/// What [`FakeWorld`] holds.
#[derive(Default)]
pub struct WorldState {
    /// The generation of the sandbox that exists, if any (the first `create` makes 1).
    pub alive: Option<u64>,
    /// How many sandboxes were created.
    pub generations: u64,
    /// The alive sandbox's files.
    pub files: HashMap<PathBuf, Vec<u8>>,
    /// Every call: when (since the world began) and what (`connect`, `create`,
    /// `exec <command>`, or what a test records).
    pub log: Vec<(Duration, String)>,
    start: Option<Instant>,
}

impl FakeWorld {
    /// A world beginning now, with no sandbox yet; with `lose_on_create`, every sandbox
    /// vanishes as soon as it is created.
    pub fn new(lose_on_create: bool) -> Arc<FakeWorld> {
        FakeWorld::begin(FakeWorld {
            lose_on_create,
            ..FakeWorld::default()
        })
    }

    /// A world beginning now whose `create` takes `create_takes`.
    pub fn creating_in(create_takes: Duration) -> Arc<FakeWorld> {
        FakeWorld::begin(FakeWorld {
            create_takes,
            ..FakeWorld::default()
        })
    }

    fn begin(world: FakeWorld) -> Arc<FakeWorld> {
        world.state().start = Some(Instant::now());
        Arc::new(world)
    }

    /// The world's state, to read or change.
    pub fn state(&self) -> MutexGuard<'_, WorldState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `what` to the log at the current time.
    pub fn record(&self, what: String) {
        let mut state = self.state();
        let at = state.start.map(|s| s.elapsed()).unwrap_or_default();
        state.log.push((at, what));
    }

    /// The sandbox vanishes, with its files.
    pub fn lose(&self) {
        let mut state = self.state();
        state.alive = None;
        state.files.clear();
    }

    /// When each call whose log line starts with `prefix` happened.
    pub fn times_of(&self, prefix: &str) -> Vec<Duration> {
        self.state()
            .log
            .iter()
            .filter(|(_, what)| what.starts_with(prefix))
            .map(|(at, _)| *at)
            .collect()
    }

    /// How many calls' log lines start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        self.times_of(prefix).len()
    }

    /// Every log line, in order.
    pub fn log(&self) -> Vec<String> {
        self.state()
            .log
            .iter()
            .map(|(_, what)| what.clone())
            .collect()
    }
}

/// One generation of the world's sandbox: gone once another generation (or none) is alive.
#[derive(Clone)]
pub struct FakeSandbox {
    world: Arc<FakeWorld>,
    /// Which sandbox of the world this is.
    pub generation: u64,
    id: String,
    home: PathBuf,
}

impl FakeSandbox {
    fn present(&self) -> Result<(), SandboxError> {
        if self.world.state().alive == Some(self.generation) {
            Ok(())
        } else {
            Err(SandboxError::Gone {
                sandbox: self.id.clone(),
            })
        }
    }
}

impl Sandbox for FakeSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn home(&self) -> &Path {
        &self.home
    }

    /// Logs `exec <command>`, then succeeds with no output while the sandbox is alive.
    async fn exec(&self, exec: &Exec) -> Result<ExecOutput, SandboxError> {
        self.world.record(format!("exec {}", exec.command));
        self.present()?;
        Ok(ExecOutput {
            exit_code: Some(0),
            stdout: String::new(),
            stderr: String::new(),
        })
    }

    async fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.present()?;
        Ok(self.world.state().files.get(path).cloned())
    }

    async fn peek_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.read_file(path).await
    }

    async fn write_file(&self, path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
        self.present()?;
        self.world
            .state()
            .files
            .insert(path.to_owned(), contents.to_vec());
        Ok(())
    }
}

/// The provider of the world's sandbox, named after its user, at home `/sandboxes/<user>`.
pub struct FakeProvider(pub Arc<FakeWorld>);

impl SandboxProvider for FakeProvider {
    type Sandbox = FakeSandbox;

    async fn connect(&self, user: &UserId) -> Result<FakeSandbox, SandboxError> {
        self.0.record("connect".into());
        let alive = self.0.state().alive;
        match alive {
            Some(generation) => Ok(self.sandbox(user, generation)),
            None => Err(SandboxError::Gone {
                sandbox: user.to_string(),
            }),
        }
    }

    async fn create(&self, user: &UserId) -> Result<FakeSandbox, SandboxError> {
        self.0.record("create".into());
        tokio::time::sleep(self.0.create_takes).await;
        let generation = {
            let mut state = self.0.state();
            state.generations += 1;
            state.alive = (!self.0.lose_on_create).then_some(state.generations);
            state.generations
        };
        Ok(self.sandbox(user, generation))
    }
}

impl FakeProvider {
    fn sandbox(&self, user: &UserId, generation: u64) -> FakeSandbox {
        FakeSandbox {
            world: Arc::clone(&self.0),
            generation,
            id: user.to_string(),
            home: PathBuf::from("/sandboxes").join(user.as_str()),
        }
    }
}
