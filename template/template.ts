// The Shmastra E2B template with project persistence, built with E2B's template SDK
// (`npm install e2b`, then `E2B_API_KEY=... npx tsx template.ts`). It starts from the original
// Shmastra template (SHMASTRA_BASE_TEMPLATE: the project in /home/user/shmastra, node, pnpm and
// PM2 installed), adds what install.sh installs, and starts the dev server as the original does.
// Copy `target/release/project-watcher` (built for x86_64 Linux) and `pm2/ecosystem.config.js`
// beside this file first.
import { Template, waitForURL } from 'e2b'

const base = process.env.SHMASTRA_BASE_TEMPLATE ?? 'shmastra'

export const template = Template()
  .fromTemplate(base)
  .copy(['install.sh', 'project-watcher', 'ecosystem.config.js'], '/tmp/shmastra-template/')
  .runCmd('sh /tmp/shmastra-template/install.sh /tmp/shmastra-template', { user: 'root' })
  .runCmd('chown -R user:user /home/user', { user: 'root' })
  .runCmd('rm -rf /tmp/shmastra-template', { user: 'root' })
  .setUser('user')
  .setStartCmd(
    'pm2 start /home/user/ecosystem.config.js --only shmastra,healer',
    waitForURL('http://localhost:4111/health'),
  )

// The name cloud-core creates sandboxes from (E2B_TEMPLATE).
await Template.build(template, process.env.E2B_TEMPLATE ?? 'shmastra-persist', {
  cpuCount: 2,
  memoryMB: 2048,
})
