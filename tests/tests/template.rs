//! The sandbox template's recipe (`template/install.sh`, run by `template/template.ts` on top
//! of the original Shmastra template): what it installs, that it can run twice, and that a
//! base template without what it needs is refused with a clear message.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

#[test]
fn the_recipe_installs_the_watcher_and_the_ecosystem_and_ignores_the_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let template = testkit::template::build(tmp.path());
    let watcher = template.bin.join("project-watcher");
    let mode = std::fs::metadata(&watcher).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    let version = Command::new(&watcher).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("project-watcher "));
    assert_eq!(
        std::fs::read(template.home.join("ecosystem.config.js")).unwrap(),
        std::fs::read(testkit::template::recipe_dir().join("../pm2/ecosystem.config.js")).unwrap()
    );
    let dir = std::fs::metadata(template.home.join(".project-watcher")).unwrap();
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    assert!(
        !template.home.join(".project-watcher/.env").exists(),
        "no secret is baked in"
    );
    assert!(template.home.join("shmastra/.logs").is_dir());

    // Run again (a rebuild on top of a layer that has it): nothing doubles.
    let files = tmp.path().join("files");
    let out = testkit::template::install(&files, &tmp.path().join("prefix"), &template.home);
    assert!(out.status.success(), "{out:?}");
    let gitignore = std::fs::read_to_string(template.home.join("shmastra/.gitignore")).unwrap();
    assert_eq!(gitignore, "node_modules/\n.logs/\n");

    // The ecosystem as PM2 reads it in the template: the three apps, the watcher only once
    // provision wrote its environment.
    let apps = |home: &std::path::Path| {
        let out = Command::new("node")
            .arg("-e")
            .arg("console.log(require(process.argv[1]).apps.map(a => a.name + ' ' + a.cwd + ' ' + a.out_file).join('\\n'))")
            .arg(home.join("ecosystem.config.js"))
            .env("HOME", home)
            .env_remove("PROJECT_DIR")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let project = template.home.join("shmastra");
    let line = |name: &str| {
        format!(
            "{name} {} {}/.logs/{name}-out.log",
            project.display(),
            project.display()
        )
    };
    assert_eq!(
        apps(&template.home),
        format!("{}\n{}\n", line("shmastra"), line("healer"))
    );
    std::fs::write(
        template.home.join(".project-watcher/.env"),
        format!("PROJECT_DIR={}\nPROJECT_TOKEN=v1.x\n", project.display()),
    )
    .unwrap();
    assert_eq!(
        apps(&template.home),
        format!(
            "{}\n{}\n{}\n",
            line("shmastra"),
            line("healer"),
            line("project-watcher")
        )
    );
}

#[test]
fn a_base_template_without_the_project_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let out = testkit::template::install(tmp.path(), &tmp.path().join("prefix"), &home);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the project") && stderr.contains("shmastra is missing"),
        "{stderr}"
    );
    assert!(!tmp.path().join("prefix/bin/project-watcher").exists());
}
