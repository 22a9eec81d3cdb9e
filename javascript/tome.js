// sd-webui-tome: hover hints, the Hires fix pass group's visibility, and the page values behind the token hint of
// the ToMe accordion.
//
// The note and the token hint are made in Python (tome_webui/ui.py, note_html): tome_core counts the tokens and
// the presets carry their figures, so no figure or rule of the merging is restated here. This script writes what
// the note depends on as JSON into the accordion's hidden `page_values` textbox whenever it changes: the ToMe
// controls' values, as gradio hands them over in the browser (their `.change` listeners, tome_webui/ui.py
// changed_js), and the WebUI's own controls Python cannot see (the image size, Hires fix and its upscale, the batch
// size: Forge Neo makes a Wan video of that many frames, whose speed-up the note gives at that length). The
// textbox's change calls the note's handler, which gets that JSON as the event's data and no inputs: gradio 4.40's
// client warns about any call that sends inputs (tests/test_webui_events.py).
//
// No timers: everything reacts to events. The page values are sent once an edit ends (a DOM `change`, an `input`
// from a script, a ToMe control's gradio change while the user is not typing into it), so the server sees one
// request per edit, not one per keystroke or slider step. At most one send per tab is on its way: an edit made
// while it is out is sent once its answer is in (see send and onNoteUpdate), so the page settles after any clicks.
//
// The WebUI loads every extension's javascript/*.js as a classic script into one global scope, so everything here
// lives in this IIFE and nothing is added to `window`. It uses only the WebUI globals gradioApp(), onUiLoaded()
// (script.js) and updateInput() (ui.js), and reads the controls by the ids the Python side gives them:
// `script_<tab>_tome_<item>` (tome_webui/ui.py, ELEM_ITEMS) and the WebUI's own `<tab>_width`, `<tab>_height`,
// `<tab>_batch_size`, `txt2img_hr`, `txt2img_hr_*`.
(function() {
    'use strict';

    var TABS = ['txt2img', 'img2img'];

    // Hints for the controls that have no tome_core FieldSpec. Every field's hint comes from its FieldSpec.help,
    // which the Python side passes as `tooltip=`: the WebUI's patched gradio sends it to the page as
    // `props.webui_tooltip`. Those win over this table, so the texts keep a single source in Python.
    var OWN_HINTS = {
        enable: 'Token Merging: merges similar image tokens in the UNet\'s attention so every step runs faster, at ' +
            'some loss of fine detail. Unchecked, generation is left exactly as it is.',
        hr_mode: 'What the Hires fix pass merges. "Same as first pass" reuses the settings above; "Own settings" ' +
            'can merge more, where the many tokens of the upscaled image make it pay most; "Off" keeps the full ' +
            'detail of the final pass at its full cost.'
    };

    function app() {
        return gradioApp();
    }

    function el(id) {
        return app().querySelector('#' + id);
    }

    function our(tab, item) {
        return el('script_' + tab + '_tome_' + item);
    }

    // A number control's value; null where the page has no such control or it holds no number.
    function numberOf(id) {
        // gradio 3 sliders hold a number box and a range; the number box comes first.
        var input = app().querySelector('#' + id + ' input[type=number]') || app().querySelector('#' + id + ' input');
        var value = input ? parseFloat(input.value) : NaN;
        return isNaN(value) ? null : value;
    }

    // ------------------------------------------------------------------------------------------- hover hints

    function applyHints(tab) {
        var prefix = 'script_' + tab + '_tome_';
        var texts = {};
        var components = (window.gradio_config && window.gradio_config.components) || [];
        components.forEach(function(comp) {
            var id = comp.props && comp.props.elem_id;
            if (id && id.indexOf(prefix) === 0 && comp.props.webui_tooltip) {
                texts[id.slice(prefix.length).replace(/-checkbox$/, '')] = comp.props.webui_tooltip;
            }
        });
        Object.keys(OWN_HINTS).forEach(function(item) {
            texts[item] = texts[item] || OWN_HINTS[item];
        });
        Object.keys(texts).forEach(function(item) {
            // The InputAccordion's own checkbox is hidden: its hint goes on the label row, where its visible
            // checkbox is, not on the whole accordion (that would show it over every gap between the controls).
            var target = item === 'enable' ? app().querySelector('#' + prefix + 'enable > .label-wrap') : our(tab, item);
            // A title already there came from the WebUI's hints.js and may be localized: keep it.
            if (target && !target.title) {
                target.title = texts[item];
            }
        });
    }

    // ------------------------------------------------------------------------------------- Hires fix group

    // Whether the WebUI's Hires fix is on: the hidden checkbox of its InputAccordion (v1.6+) holds the value the
    // generation gets; inputAccordion.js keeps it in step with the visible checkbox and with pasted infotext.
    // null when there is no such control (another UI): then our group stays visible rather than lost.
    function hiresOn() {
        var box = app().querySelector('#txt2img_hr-checkbox input') || app().querySelector('#txt2img_enable_hr input');
        return box ? box.checked : null;
    }

    function syncHiresGroup() {
        var group = our('txt2img', 'hires');
        var on = hiresOn();
        if (group && on !== null) {
            var display = on ? '' : 'none';
            if (group.style.display !== display) {
                group.style.display = display;
            }
        }
    }

    // ------------------------------------------------------------------------------------------ page values

    // The WebUI's own controls each tab's note and token hint depend on.
    var PAGE_CONTROLS = {
        txt2img: ['txt2img_width', 'txt2img_height', 'txt2img_batch_size', 'txt2img_hr', 'txt2img_hr-checkbox',
            'txt2img_enable_hr', 'txt2img_hr_scale', 'txt2img_hr_resize_x', 'txt2img_hr_resize_y'],
        img2img: ['img2img_width', 'img2img_height', 'img2img_batch_size']
    };

    // How many times page values were sent (numbering every send, so that each is a change gradio acts on and the
    // hint that answers it can say which: `data-tome-send`), and each tab's state: the values it sent last and their
    // number, the last send its hint answered, whether an edit waits for that answer, and when the last send left.
    var sends = 0;
    var state = {};
    TABS.forEach(function(tab) {
        state[tab] = {values: null, sent: 0, answered: 0, waiting: false, sentAt: 0};
    });
    // A send whose answer has not come in this long is taken as lost (the server failed it, or gradio dropped it):
    // the next edit is sent anyway. Checked when an edit comes, never by a timer.
    var LOST_AFTER_MS = 10000;

    // tab -> the ToMe controls' values by item name ("preset", "ratio", ...): the values the page was built with
    // (gradio's config), then as each change hands them over (onChanged).
    var controls = {};

    function initialControls(tab) {
        var prefix = 'script_' + tab + '_tome_';
        var values = {};
        var components = (window.gradio_config && window.gradio_config.components) || [];
        components.forEach(function(comp) {
            var id = comp.props && comp.props.elem_id;
            if (id && id.indexOf(prefix) === 0 && 'value' in comp.props) {
                values[id.slice(prefix.length)] = comp.props.value;
            }
        });
        return values;
    }

    // The values as tome_webui/ui.py's PageValues reads them (but the send number), as JSON.
    function pageValues(tab) {
        var values = {
            width: numberOf(tab + '_width'),
            height: numberOf(tab + '_height'),
            // Python turns it into frames only where the loaded model makes a video of the batch (Forge Neo's Wan).
            batch_size: numberOf(tab + '_batch_size'),
            controls: controls[tab]
        };
        if (tab === 'txt2img') {
            values.hires = hiresOn();
            values.hr_scale = numberOf('txt2img_hr_scale');
            values.hr_resize_x = numberOf('txt2img_hr_resize_x');
            values.hr_resize_y = numberOf('txt2img_hr_resize_y');
        }
        return JSON.stringify(values);
    }

    function pageValuesBox(tab) {
        return app().querySelector('#script_' + tab + '_tome_page_values textarea') ||
            app().querySelector('#script_' + tab + '_tome_page_values input');
    }

    // Hand the values to gradio: the change of the hidden textbox runs the note's handler. Values as they were sent
    // last are not sent again (one click on Hires fix fires an `input` and a `change`). gradio drops an event while
    // the same event's previous call is pending, so while a send is out the edit only waits (onNoteUpdate sends it
    // once the answer is in): one call at a time, and none once the last is answered.
    function send(tab) {
        var box = pageValuesBox(tab);
        var own = state[tab];
        var values = pageValues(tab);
        if (!box || (!own.waiting && values === own.values)) {
            return;
        }
        if (own.sent > own.answered && Date.now() - own.sentAt < LOST_AFTER_MS) {
            own.waiting = true;
            return;
        }
        sends += 1;
        own.values = values;
        own.sent = sends;
        own.waiting = false;
        own.sentAt = Date.now();
        var numbered = JSON.parse(values);
        numbered.send = sends;
        box.value = JSON.stringify(numbered);
        updateInput(box);
    }

    // Something changed inside the note's wrapper: the answer to a send (the hint re-rendered with the number of
    // the send it answers), or gradio's own pending state and progress text coming and going while a call is out.
    // Only a new answer counts; once the last send is answered, an edit that waited for it is sent.
    function onNoteUpdate(tab) {
        var hint = our(tab, 'token_hint');
        var answered = hint ? parseInt(hint.getAttribute('data-tome-send'), 10) : NaN;
        var own = state[tab];
        if (isNaN(answered) || answered <= own.answered) {
            return;
        }
        own.answered = answered;
        if (own.waiting && answered >= own.sent) {
            send(tab);
        }
    }

    function within(target, ids) {
        return !!(target && target.closest) && !!target.closest(ids.map(function(id) {
            return '#' + id;
        }).join(', '));
    }

    // The tab of the WebUI control `target` is in, among those the token hint depends on; else null.
    function pageTab(target) {
        var found = TABS.filter(function(tab) {
            return within(target, PAGE_CONTROLS[tab]);
        });
        return found.length ? found[0] : null;
    }

    // The tab of the ToMe accordion `target` is in; else null.
    function ownTab(target) {
        var found = TABS.filter(function(tab) {
            return within(target, ['script_' + tab + '_tome_enable']);
        });
        return found.length ? found[0] : null;
    }

    // A control that is edited over many `input` events (typing, dragging), each a gradio change, until its DOM
    // `change` ends the edit.
    function isTextLike(target) {
        return target.tagName === 'TEXTAREA' ||
            (target.tagName === 'INPUT' && ['number', 'range', 'text'].indexOf(target.type) !== -1);
    }

    // --------------------------------------------------------------------------------------------- wiring

    var dirty = {};

    // The tabs to refresh once the current event is over: after its other handlers, as gradio copies a slider's
    // range to its number box and inputAccordion.js its visible checkbox to the hidden one in handlers of their
    // own. A microtask, not a timer: it runs as soon as this event is done, and once for a burst of events.
    function schedule(tab) {
        var first = Object.keys(dirty).length === 0;
        dirty[tab] = true;
        if (first) {
            queueMicrotask(function() {
                var tabs = Object.keys(dirty);
                dirty = {};
                syncHiresGroup();
                tabs.forEach(send);
            });
        }
    }

    // A DOM event. WebUI controls: a user's `change` (the end of typing or dragging, a click) or an `input` from a
    // script (the WebUI's updateInput(), inputAccordion.js); a user's `input` events come with every keystroke or
    // slider step and wait for the `change` that ends the edit, so the server sees one request per edit.
    // ToMe controls report their changes themselves (onChanged), except the end of typing or dragging.
    function onEdit(event) {
        var target = event.target;
        if (event.type === 'input' && event.isTrusted) {
            return;
        }
        var tab = pageTab(target);
        if (tab === null) {
            tab = ownTab(target);
            if (tab === null || event.type !== 'change' || !isTextLike(target) || target === pageValuesBox(tab)) {
                return;
            }
        }
        schedule(tab);
    }

    // A ToMe control's value changed in gradio (tome_webui/ui.py, changed_js): clicked, set by a script or from
    // Python (pasted infotext), or typed; `detail` holds every control's value. While the user is still typing
    // into or dragging a ToMe control, the DOM `change` that ends the edit follows (onEdit).
    function onChanged(event) {
        var detail = event.detail || {};
        var tab = detail.tab;
        if (TABS.indexOf(tab) === -1 || !Array.isArray(detail.names) || !Array.isArray(detail.values)) {
            return;
        }
        var own = controls[tab] = controls[tab] || {};
        detail.names.forEach(function(name, index) {
            own[name] = detail.values[index];
        });
        var active = app().activeElement || document.activeElement;
        if (!(active && ownTab(active) === tab && isTextLike(active))) {
            schedule(tab);
        }
    }

    onUiLoaded(function() {
        TABS.forEach(function(tab) {
            controls[tab] = initialControls(tab);
        });
        TABS.forEach(applyHints);
        syncHiresGroup();
        TABS.forEach(send);
        app().addEventListener('input', onEdit);
        app().addEventListener('change', onEdit);
        document.addEventListener('tome_changed', onChanged);
        TABS.forEach(function(tab) {
            var note = our(tab, 'cap_note');
            if (note) {
                new MutationObserver(function() {
                    onNoteUpdate(tab);
                }).observe(note, {childList: true, subtree: true});
            }
        });
    });
})();
