package messages

import "github.com/streamd/streamd/wakeup"

// Notify wakes the long polls on queue of this Client's Hub (ClientConfig.Wakeups).
// Send calls it; call it after committing a transaction that used SendTx, which
// cannot know when (or whether) its messages become visible.
func (c *Client) Notify(queue string) { c.hub.Notify(wakeup.KindQueue, queue) }
