//! The Shmastra sandbox template for tests, made by the template's own recipe: a small
//! Shmastra-like project in `<dir>/home/shmastra` (the original template's part), then
//! `template/install.sh` run exactly as `template/template.ts` runs it, with `PREFIX` and
//! `SANDBOX_HOME` pointed into `dir`. The fake E2B copies `home` for every new sandbox; put
//! `bin` (the watcher) and [`crate::pm2::pm2_bin`]'s folder on its `PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A built template.
#[derive(Debug, Clone)]
pub struct Template {
    /// The sandbox user's home: the fake E2B's template directory.
    pub home: PathBuf,
    /// Where `install.sh` put `project-watcher`.
    pub bin: PathBuf,
}

/// The repository's `template/` and `pm2/` folders.
pub fn recipe_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../template")
}

/// Builds the template into `dir` and returns where it is.
pub fn build(dir: &Path) -> Template {
    let home = dir.join("home");
    let project = home.join("shmastra");
    std::fs::create_dir_all(project.join("src")).expect("template project");
    std::fs::write(
        project.join("package.json"),
        "{\n  \"name\": \"shmastra\",\n  \"private\": true,\n  \"scripts\": {\"dev\": \"mastra dev\"}\n}\n",
    )
    .expect("package.json");
    std::fs::write(
        project.join("src/index.ts"),
        "export const agent = 'template';\n",
    )
    .expect("index.ts");
    std::fs::write(project.join(".gitignore"), "node_modules/\n").expect(".gitignore");
    let files = dir.join("files");
    std::fs::create_dir_all(&files).expect("files");
    std::fs::copy(
        crate::cargo_bin::project_watcher(),
        files.join("project-watcher"),
    )
    .expect("copy the watcher");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../pm2/ecosystem.config.js"),
        files.join("ecosystem.config.js"),
    )
    .expect("copy the ecosystem file");
    let prefix = dir.join("prefix");
    let out = install(&files, &prefix, &home);
    assert!(
        out.status.success(),
        "install.sh failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Template {
        home,
        bin: prefix.join("bin"),
    }
}

/// Runs `template/install.sh files` with `PREFIX=prefix`, `SANDBOX_HOME=home`, and PM2 on
/// `PATH`.
pub fn install(files: &Path, prefix: &Path, home: &Path) -> std::process::Output {
    let pm2_dir = crate::pm2::pm2_bin()
        .parent()
        .expect("pm2's folder")
        .to_owned();
    let path = format!(
        "{}:{}",
        pm2_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("sh")
        .arg(recipe_dir().join("install.sh"))
        .arg(files)
        .env("PATH", path)
        .env("PREFIX", prefix)
        .env("SANDBOX_HOME", home)
        .output()
        .expect("sh runs")
}

/// The fake E2B serving the template as a deployment's sandboxes are: the watcher and PM2 on
/// `PATH`, hermetic git, a dev server (`SHMASTRA_CMD`) answering its health check on
/// `127.0.0.1:<dev_port>`, the healer idle, the watcher's debounce 200 ms and max delay 2 s.
pub struct ShmastraE2b {
    /// The fake, its template named [`TEMPLATE_NAME`].
    pub fake: crate::fake_e2b::FakeE2b,
    /// The template it copies.
    pub template: Template,
    /// Where each sandbox's dev server listens.
    pub dev_port: u16,
}

/// The name the fake knows the template by (`E2B_TEMPLATE`).
pub const TEMPLATE_NAME: &str = "shmastra-persist";

impl ShmastraE2b {
    /// Builds the template into `dir/template` and starts the fake with its sandboxes under
    /// `dir/e2b`.
    pub fn start(dir: &Path) -> ShmastraE2b {
        let template = build(&dir.join("template"));
        let fake =
            crate::fake_e2b::FakeE2b::start(&dir.join("e2b"), &[(TEMPLATE_NAME, &template.home)]);
        let pm2 = crate::pm2::pm2_bin();
        fake.set_env(
            "PATH",
            &format!(
                "{}:{}:{}",
                template.bin.display(),
                pm2.parent().expect("pm2's folder").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
        for (name, value) in crate::git::hermetic_env(dir) {
            if !matches!(name, "HOME" | "XDG_CONFIG_HOME") {
                fake.set_env(name, &value.display().to_string());
            }
        }
        let dev_port = crate::net::free_port();
        fake.set_env(
            "SHMASTRA_CMD",
            &format!(
                "exec node -e \"require('http').createServer((q, r) => r.end('ok')).listen({dev_port}, '127.0.0.1')\""
            ),
        );
        fake.set_env("HEALER_CMD", "exec sleep 3600");
        fake.set_env("WATCHER_DEBOUNCE", "200ms");
        fake.set_env("WATCHER_MAX_DELAY", "2s");
        ShmastraE2b {
            fake,
            template,
            dev_port,
        }
    }

    /// The dev server's health URL in every sandbox of this fake.
    pub fn health_url(&self) -> String {
        format!("http://127.0.0.1:{}/health", self.dev_port)
    }
}
